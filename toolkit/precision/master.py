"""fp32 master weights for a model whose working weights are 16-bit.

Micikevicius et al., "Mixed Precision Training", ICLR 2018, §3.1: the forward and backward
passes use 16-bit weights, but the optimizer updates an fp32 *master copy*, and the 16-bit
weights are re-made from it after every step. Why: an update lr·g smaller than half the spacing
of the 16-bit numbers around a weight w (`toolkit.formats.ulp`) rounds away, every step,
forever (bf16 spacing just below w = 1 is 2^-8, so a step down of lr·g < 2^-9 ≈ 0.002 never
moves it); the fp32 copy accumulates those updates until they add up. One step:

    master.grad = working.grad (16-bit) → fp32, divided by the loss scale      (`unscale_`)
    inner optimizer steps the masters (fp32 Adam: master, exp_avg, exp_avg_sq)
    working ← master rounded to 16 bits                                        (`copy_to_working`)

Bytes per parameter after a step (ZeRO §3.1's mixed-precision Adam, `toolkit.memory.MIXED_ADAM`):
2 (16-bit weights) + 2 (16-bit gradients) + 12 (fp32 master 4, exp_avg 4, exp_avg_sq 4) = 16.
The fp32 gradient exists only inside `step()`: it is dropped after the update, so it is not
among the held bytes (Megatron-LM keeps fp32 "main" gradients instead, 18 bytes per parameter).

`state` is keyed by the working parameters (what `toolkit.memory.held_model_states` and
checkpoints see): ``state[p] = {"master": fp32 tensor, "exp_avg": ..., "exp_avg_sq": ...,
"step": ...}``, so `state_dict()` carries the master weights and a resume is exact.

    model = TinyGPT(cfg).to(torch.bfloat16)
    opt = MasterWeightOptimizer(model.parameters(), torch.optim.Adam, lr=1e-3)
    model(x, y)[1].backward(); opt.step(); opt.zero_grad()

It composes with sharding: ``ShardedOptimizer(bf16_params, master_weights(torch.optim.Adam),
stage=2)`` keeps a master of the rank's shard only (ZeRO's 2Ψ + 14Ψ/N_d), and
``MasterWeightOptimizer(FullyShardedDataParallel(model, shard_dtype=torch.bfloat16)
.parameters(), ...)`` is DeepSpeed's ZeRO-3 layout (16Ψ/N_d as 2 + 2 + 12).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Iterable

import torch
from torch import Tensor, nn


def master_copy(params: Iterable[Tensor], dtype: torch.dtype = torch.float32) -> list[nn.Parameter]:
    """A `dtype` copy of each parameter, on its device, as a new leaf `nn.Parameter` (the
    master weights: the optimizer steps these)."""
    if not dtype.is_floating_point:
        raise ValueError(f"master_copy: dtype must be a floating dtype, got {dtype}")
    return [nn.Parameter(p.detach().to(dtype).clone()) for p in params]


@torch.no_grad()
def copy_to_working(masters: Iterable[Tensor], params: Iterable[Tensor]) -> None:
    """Round every master into its working parameter, in place (`copy_` casts to the working
    dtype with round-to-nearest-even). The working tensors keep their identity and storage."""
    masters, params = list(masters), list(params)
    if len(masters) != len(params):
        raise ValueError(f"copy_to_working: {len(masters)} masters for {len(params)} parameters")
    for m, p in zip(masters, params):
        if m.shape != p.shape:
            raise ValueError(f"copy_to_working: master of shape {tuple(m.shape)} for a parameter "
                             f"of shape {tuple(p.shape)}")
        p.copy_(m)


class MasterWeightOptimizer(torch.optim.Optimizer):
    """Any `torch.optim` optimizer, stepping fp32 masters of 16-bit working parameters (module
    docstring). ``MasterWeightOptimizer(params, optimizer_class=torch.optim.Adam, *,
    master_dtype=torch.float32, **defaults)``: `defaults` go to `optimizer_class`, which is
    built over the masters; param groups keep their own options, and learning-rate schedulers
    may change ``param_groups[i]["lr"]`` (copied to the inner optimizer at every step).

    `unscale_(inv_scale)` makes the fp32 master gradients (working gradient × inv_scale) and
    returns whether any is inf or NaN; `step()` does it with inv_scale = 1 when nobody has.
    """

    def __init__(self, params: Iterable[Any], optimizer_class: type[torch.optim.Optimizer]
                 = torch.optim.Adam, *, master_dtype: torch.dtype = torch.float32,
                 **defaults: Any) -> None:
        if not master_dtype.is_floating_point:
            raise ValueError(f"MasterWeightOptimizer: master_dtype must be a floating dtype, got "
                             f"{master_dtype}")
        super().__init__(params, defaults)
        self.master_dtype = master_dtype
        self._masters: dict[Tensor, nn.Parameter] = {}
        inner_groups = []
        for group in self.param_groups:
            masters = master_copy(group["params"], master_dtype)
            self._masters.update(zip(group["params"], masters))
            inner_groups.append({**_options(group), "params": masters})
        self.optim = optimizer_class(inner_groups, **defaults)
        self._unscaled = False
        self._sync_state()

    def master(self, p: Tensor) -> nn.Parameter:
        """The master copy of working parameter `p`."""
        return self._masters[p]

    def _pairs(self) -> Iterable[tuple[Tensor, nn.Parameter]]:
        for group in self.param_groups:
            for p in group["params"]:
                yield p, self._masters[p]

    def _sync_state(self) -> None:
        """`state[p]` = the master and the inner optimizer's state of it (the same tensors)."""
        for p, m in self._pairs():
            self.state[p] = {"master": m, **self.optim.state.get(m, {})}

    @torch.no_grad()
    def unscale_(self, inv_scale: float = 1.0) -> Tensor:
        """Set every master's gradient to its working gradient in fp32 times `inv_scale` (the
        multiply happens in fp32, so small unscaled gradients do not underflow again in 16
        bits). Returns a 0-dim float tensor on the parameters' device: 1 if any is inf/NaN."""
        found = None
        for p, m in self._pairs():
            if p.grad is None:
                m.grad = None
                continue
            m.grad = p.grad.to(self.master_dtype, copy=True).mul_(inv_scale)  # never in place
            bad = (~torch.isfinite(m.grad)).any().to(self.master_dtype)
            found = bad if found is None else torch.maximum(found, bad)
        self._unscaled = True
        if found is None:  # no gradients at all: nothing is non-finite
            first = next(iter(self._masters.values()), None)
            device = first.device if first is not None else None
            found = torch.zeros((), dtype=self.master_dtype, device=device)
        return found

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        """Step the masters with their fp32 gradients (made by `unscale_`, or now with scale 1),
        round them into the working parameters, and drop the fp32 gradients."""
        loss = closure() if closure is not None else None
        if not self._unscaled:
            self.unscale_(1.0)
        for group, inner in zip(self.param_groups, self.optim.param_groups):
            inner.update(_options(group))  # learning-rate schedulers write to our groups
        self.optim.step()
        working, masters = zip(*self._pairs()) if self._masters else ((), ())
        copy_to_working(masters, working)
        for m in masters:
            m.grad = None  # the fp32 gradient lives only inside step(): 2 + 2 + 12 bytes held
        self._unscaled = False
        self._sync_state()
        return loss

    def skip(self) -> None:
        """Forget the master gradients of a step that will not be taken (a loss scaler found
        inf/NaN): the next step starts from the next backward's gradients."""
        for _, m in self._pairs():
            m.grad = None
        self._unscaled = False

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the working gradients (as torch does) and any master gradient."""
        super().zero_grad(set_to_none=set_to_none)
        self.skip()

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Groups get their masters at construction; adding one later is not supported."""
        if hasattr(self, "optim"):
            raise NotImplementedError("MasterWeightOptimizer: pass every param group to the "
                                      "constructor (their masters are made there)")
        super().add_param_group(param_group)

    def state_dict(self) -> dict[str, Any]:
        """torch's layout (``state`` by parameter index, ``param_groups``); each parameter's
        state holds its fp32 ``master`` beside the inner optimizer's tensors."""
        self._sync_state()
        return super().state_dict()

    @torch.no_grad()
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load what `state_dict` saved (same parameters, same order). Masters and optimizer
        state keep their saved dtype (torch's own loader would cast them to the 16-bit working
        dtype, losing exactly what the masters are for); the working parameters are then
        re-made from the masters."""
        groups, state = state_dict["param_groups"], state_dict["state"]
        if [len(g["params"]) for g in groups] != [len(g["params"]) for g in self.param_groups]:
            raise ValueError("MasterWeightOptimizer.load_state_dict: the saved param groups do "
                             "not match this optimizer's (same parameters, same order needed)")
        index = 0
        for saved, group, inner in zip(groups, self.param_groups, self.optim.param_groups):
            options = {k: v for k, v in saved.items() if k != "params"}
            group.update(options)
            inner.update(options)
            for p in group["params"]:
                m = self._masters[p]
                entry = state.get(index, state.get(str(index)))
                index += 1
                if entry is None:
                    continue
                m.copy_(entry["master"])
                self.optim.state[m] = {k: v.detach().clone().to(m.device)
                                       if isinstance(v, Tensor) else v
                                       for k, v in entry.items() if k != "master"}
        copy_to_working([m for _, m in self._pairs()], [p for p, _ in self._pairs()])
        self._sync_state()


def master_weights(optimizer_class: type[torch.optim.Optimizer], *,
                   master_dtype: torch.dtype = torch.float32,
                   ) -> Callable[..., MasterWeightOptimizer]:
    """`optimizer_class` with fp32 masters, as a factory ``(params, **defaults) -> optimizer``:
    pass it where an optimizer class is expected (``ShardedOptimizer(params,
    master_weights(torch.optim.Adam), stage=2, lr=...)``)."""
    return functools.partial(MasterWeightOptimizer, optimizer_class=optimizer_class,
                             master_dtype=master_dtype)


def _options(group: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in group.items() if k != "params"}


__all__ = ["MasterWeightOptimizer", "copy_to_working", "master_copy", "master_weights"]
