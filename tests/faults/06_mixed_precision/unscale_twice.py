"""Mistake: train_step divides the 16-bit gradients by the scale in place, then calls unscale_,
which divides again. Expected: wrong_result on the training check, "unscaled twice".
"""


def train_step(model, masters, optimizer, scaler, loss_fn):
    params = list(model.parameters())
    model.zero_grad(set_to_none=True)
    scaler.scale_loss(loss_fn(model)).backward()
    all_reduce_gradients(params)
    with torch.no_grad():
        for p in params:
            p.grad.div_(scaler.scale)  # unscaled here...
    found = scaler.unscale_(params, masters)  # ...and again here
    if not found:
        optimizer.step()
        copy_to_working(masters, params)
    optimizer.zero_grad(set_to_none=True)
    scaler.update(found)
    return not found
