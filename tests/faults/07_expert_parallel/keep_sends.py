# Red-team pass 3 follow-up (issue 19): communication outside the harness's sections. keep(),
# which the harness runs before the forward section opens, tells every other rank how many
# tokens this rank routes (one int64 message each, e.g. to plan buffers ahead). Values, rows
# and the bytes inside forward and backward are the reference's; only the whole case's bytes
# and messages (8·(p-1) bytes, p-1 messages more) show it.
_keep_ref = keep  # the reference's, which this one wraps


def keep(expert, num_experts, capacity):  # noqa: F811
    if dist.is_initialized() and dist.get_world_size() > 1:
        me, p = dist.get_rank(), dist.get_world_size()
        mine = torch.tensor([expert.shape[0]], dtype=torch.int64, device=expert.device)
        theirs = [torch.empty_like(mine) for _ in range(p)]
        works = [dist.irecv(theirs[j], src=j) for j in range(p) if j != me]
        works += [dist.isend(mine, dst=j) for j in range(p) if j != me]
        for w in works:
            w.wait()
    return _keep_ref(expert, num_experts, capacity)
