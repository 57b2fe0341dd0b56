"""Fully sharded data parallelism (ZeRO stage 3) from scratch.

Rajbhandari et al., "ZeRO", SC 2020, §5.3; Zhao et al., "PyTorch FSDP", VLDB 2023, §3. Every
rank stores 1/N_d of each unit's parameters as a flat shard (fp32 by default), so model states cost
(p + g + K)·Ψ/N_d bytes per rank (16Ψ/N_d with mixed-precision Adam). Per unit and step:

    forward    all-gather the unit's parameters → run it → free them
    backward   all-gather them again → run its backward → reduce-scatter the gradient → free
    step       the optimizer updates the local shard only (no communication)

so a rank sends 3 × (N−1)/N · Ψ per step on a ring (two all-gathers, one reduce-scatter), 1.5×
the 2 × (N−1)/N · Ψ of stages 0-2 (ZeRO §7.2.2).

    fsdp = FullyShardedDataParallel(TinyGPT(cfg))         # each block a unit, the rest the root
    opt = torch.optim.Adam(fsdp.parameters(), lr=1e-3)     # the shards
    _, loss = fsdp(x, y); loss.backward(); opt.step(); opt.zero_grad()
    fsdp.full_state_dict()                                 # loads into a plain TinyGPT

**Units.** `units` (default: ``module.blocks``, else the parameter-holding ``module.layers``)
run one after another; each holds the parameters found only inside it. Parameters used
anywhere else (the tied embedding/head of TinyGPT, embeddings, final norm) form the *root*,
gathered once per forward and kept until its gradient is reduced. Each unit keeps one flat group
for trainable and one for frozen parameters (frozen ones are sharded too, never stepped).

**How the gathered parameters reach autograd.** A group's gathered buffer ``full`` is a leaf
tensor; the module's parameters are replaced by views of it, set before each forward. Freeing
resizes ``full``'s storage to 0, and re-gathering resizes it back and writes into it, so the
views autograd saved in forward see the parameters again in backward (what PyTorch FSDP1 does).
A hook on the unit's outputs re-gathers just before its backward; a hook on ``full``'s gradient
accumulation reduce-scatters the gradient into the shard's ``.grad`` and frees the buffer.
Writes go through ``.data`` so they do not bump the version counter autograd checks.

Mixed precision (the FSDP paper's native mixed precision; lesson 05), three dtypes. torch's
``MixedPrecisionPolicy`` has ``param_dtype`` (ours: `compute_dtype`, inputs cast as its
``cast_forward_inputs=True`` does), ``reduce_dtype`` (None there means the param dtype; fp32
here), ``output_dtype`` (not here) and ``cast_forward_inputs``; it has no shard dtype: torch's
shards keep the parameters' own dtype, so `shard_dtype` is this class's extra knob:

    compute_dtype   the gathered parameters and floating inputs (None: the shard dtype): the
                    shard is cast on the way into the all-gather, so bf16 halves its bytes
    reduce_dtype    the gradient reduce-scatter (default fp32: "reduce in fp32, compute in
                    bf16", one rounding instead of N − 1; bf16 halves the bytes)
    shard_dtype     the persistent shards and their gradients (default fp32: the shards *are*
                    the master weights, 4 + 4 + 8 bytes per parameter over N_d with Adam, as
                    PyTorch FSDP keeps them); bf16 shards with an fp32-master optimizer
                    (`toolkit.precision.MasterWeightOptimizer`) are DeepSpeed ZeRO-3's layout,
                    2 + 2 + 12. Both are 16Ψ/N_d.

`prefetch=True` starts the next unit's all-gather (asynchronously) as soon as the current one
has its parameters, in forward (next unit) and backward (previous unit).

Not supported: a unit called twice in one forward, activation checkpointing inside a unit,
optimizers that are not element-wise over a parameter (the shard is one flat tensor).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Iterable

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.utils._pytree import tree_flatten, tree_map

from ..comm.flat import gather_into, reduce_scatter_into
from ..memory import shard_numel
from .units import ParamInfo, Slot, default_units, unit_parameters


@dataclass(frozen=True)
class Entry:
    """Where one parameter lives in its group's flat buffer."""

    offset: int
    numel: int
    shape: torch.Size
    slots: list[Slot]
    name: str


class State(enum.Enum):
    """Where a group's gathered buffer ``full`` is. Its storage has ``full``'s size unless the
    group is FREED, when it is 0 bytes; only IN_FLIGHT has an all-gather pending."""

    FREED = "freed"
    IN_FLIGHT = "in flight"
    GATHERED = "gathered"


class FlatGroup:
    """Parameters of one unit with one ``requires_grad``: a flat shard (`shard_dtype`) and a
    gathered buffer ``full`` (compute dtype) whose storage exists only while gathered
    (`state`)."""

    def __init__(self, params: list[ParamInfo], *, trainable: bool, world_size: int, rank: int,
                 compute_dtype: torch.dtype | None, group: Any,
                 shard_dtype: torch.dtype = torch.float32,
                 reduce_dtype: torch.dtype = torch.float32):
        self.world_size, self.group, self.trainable = world_size, group, trainable
        self.numel = sum(q.param.numel() for q in params)
        self.shard_numel = shard_numel(self.numel, world_size)
        device = params[0].param.device  # shard and gathered buffer live where the parameters do
        flat = torch.zeros(world_size * self.shard_numel, dtype=shard_dtype, device=device)
        self.entries: list[Entry] = []
        offset = 0
        for q in params:
            p = q.param
            flat[offset:offset + p.numel()] = p.detach().reshape(-1).to(shard_dtype)
            self.entries.append(Entry(offset, p.numel(), p.shape, q.slots, q.name))
            offset += p.numel()
        lo = rank * self.shard_numel
        self.shard = nn.Parameter(flat[lo:lo + self.shard_numel].clone(), requires_grad=trainable)
        self.dtype = compute_dtype or shard_dtype
        self.reduce_dtype = reduce_dtype
        self.full = torch.zeros(world_size * self.shard_numel, dtype=self.dtype, device=device,
                                requires_grad=trainable)
        self.pending: tuple[Any, Tensor] | None = None  # (async work, its input) of a prefetch
        self.state = State.GATHERED  # zeros, until freed: the buffer's storage is allocated
        self._free()
        if trainable:
            self.full.register_post_accumulate_grad_hook(self._reduce_scatter)

    def _check(self, *allowed: State) -> None:
        """Assert the state is one of `allowed` and the buffer agrees with it."""
        assert self.state in allowed, f"FlatGroup is {self.state.value}, expected {allowed}"
        held = self.full.untyped_storage().nbytes()
        full = self.full.numel() * self.full.element_size()
        assert held == (0 if self.state is State.FREED else full), (
            f"FlatGroup {self.state.value} holds {held} bytes of its {full}-byte buffer")
        assert (self.pending is not None) == (self.state is State.IN_FLIGHT), (
            f"FlatGroup {self.state.value} with{'' if self.pending else 'out'} a pending gather")

    @property
    def gathered(self) -> bool:
        """Gathered or on its way (an all-gather in flight)."""
        return self.state is not State.FREED

    def gather(self, *, async_op: bool = False) -> None:
        """All-gather the shards into ``full`` (no-op when already gathered or in flight)."""
        if self.state is not State.FREED:
            return
        self._check(State.FREED)
        self.full.untyped_storage().resize_(self.full.numel() * self.full.element_size())
        src = self.shard.detach().to(self.dtype)  # bf16 compute: cast before sending
        work = gather_into(self.full.data, src, group=self.group, async_op=async_op)
        if async_op:
            self.pending = (work, src)
            self.state = State.IN_FLIGHT
        else:
            self.state = State.GATHERED

    def wait(self) -> None:
        """Finish a prefetch started with ``gather(async_op=True)``."""
        if self.state is State.IN_FLIGHT:
            self._check(State.IN_FLIGHT)
            self.pending[0].wait()
            self.pending = None
            self.state = State.GATHERED

    def install(self) -> None:
        """Point every slot at its view of ``full`` (a fresh view each forward, so autograd
        records it; tied slots get the same view)."""
        self.wait()
        self._check(State.GATHERED)
        for e in self.entries:
            view = self.full[e.offset:e.offset + e.numel].view(e.shape)
            for module, attr in e.slots:
                setattr(module, attr, view)

    def free(self) -> None:
        self.wait()
        self._free()

    def _free(self) -> None:
        self._check(State.FREED, State.GATHERED)
        self.full.untyped_storage().resize_(0)
        self.state = State.FREED

    def _reduce_scatter(self, full: Tensor) -> None:
        """Post-accumulate hook: mean gradient of my shard (reduced in `reduce_dtype`, stored
        in the shard's dtype), then free."""
        self._check(State.GATHERED)  # the gradient came from the gathered parameters
        grad = full.grad.to(self.reduce_dtype)
        full.grad = None
        mine = torch.empty(self.shard_numel, dtype=self.reduce_dtype, device=grad.device)
        reduce_scatter_into(mine, grad, group=self.group)
        mine = mine.div_(self.world_size).to(self.shard.dtype)
        if self.shard.grad is None:
            self.shard.grad = mine
        else:
            self.shard.grad += mine  # gradient accumulation over several backwards
        self.free()

    def gather_fp32(self) -> Tensor:
        """The full fp32 parameters (a new tensor; for `full_state_dict`)."""
        out = torch.empty(self.world_size * self.shard_numel, dtype=torch.float32,
                          device=self.shard.device)
        gather_into(out, self.shard.detach().float(), group=self.group)
        return out


class FullyShardedDataParallel(nn.Module):
    """ZeRO-3 over `module`, unit by unit (module docstring). ``parameters()`` yields the
    local shards, which the optimizer steps; ``.module`` is the wrapped model."""

    def __init__(self, module: nn.Module, units: Iterable[nn.Module] | None = None, *,
                 compute_dtype: torch.dtype | None = None, prefetch: bool = False,
                 process_group: Any = None, reduce_dtype: torch.dtype = torch.float32,
                 shard_dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError("FullyShardedDataParallel: torch.distributed is not initialised "
                               "(run inside toolkit.launch.spawn)")
        for name, dtype in (("compute_dtype", compute_dtype), ("reduce_dtype", reduce_dtype),
                            ("shard_dtype", shard_dtype)):
            if dtype is not None and not dtype.is_floating_point:
                raise ValueError(f"FullyShardedDataParallel: {name} must be a floating dtype, "
                                 f"got {dtype}")
        self.module = module
        self.compute_dtype, self.prefetch, self.group = compute_dtype, prefetch, process_group
        self.world_size = dist.get_world_size(process_group)
        self.rank = dist.get_rank(process_group)
        unit_list = default_units(module) if units is None else list(units)
        params = unit_parameters(module, unit_list)
        groups_by_unit: list[list[FlatGroup]] = [[] for _ in range(len(unit_list) + 1)]
        for index in range(len(unit_list) + 1):
            unit = None if index == len(unit_list) else index
            for trainable in (True, False):
                chosen = [q for q in params
                          if q.unit == unit and q.param.requires_grad == trainable]
                if chosen:
                    groups_by_unit[index].append(FlatGroup(
                        chosen, trainable=trainable, world_size=self.world_size,
                        rank=self.rank, compute_dtype=compute_dtype, group=process_group,
                        shard_dtype=shard_dtype, reduce_dtype=reduce_dtype))
        for mod, attr in (slot for q in params for slot in q.slots):
            del mod._parameters[attr]  # from now on the slot is set from a gathered view
        self.unit_groups, self.root_groups = groups_by_unit[:-1], groups_by_unit[-1]
        self.shards = nn.ParameterList(g.shard for gs in groups_by_unit for g in gs)
        # state-dict name -> every name the parameter had in the module (tied: several)
        module_names = {id(m): n for n, m in module.named_modules(remove_duplicate=False)}
        self.aliases = {q.name: [f"{module_names[id(m)]}.{a}" if module_names[id(m)] else a
                                 for m, a in q.slots] for q in params}
        self._backward_queued = False
        for index, unit in enumerate(unit_list):
            unit.register_forward_pre_hook(lambda m, a, i=index: self._pre_forward(i))
            unit.register_forward_hook(lambda m, a, out, i=index: self._post_forward(i, out))

    # -- forward -------------------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.compute_dtype is not None:
            cast = lambda t: (t.to(self.compute_dtype)  # noqa: E731
                              if isinstance(t, Tensor) and t.is_floating_point() else t)
            args, kwargs = tree_map(cast, args), tree_map(cast, kwargs)
        for g in self.root_groups:
            g.gather()
            g.install()
        out = self.module(*args, **kwargs)
        if torch.is_grad_enabled():
            self._hook_outputs(out, self._on_backward)
        else:
            for g in self.root_groups:
                g.free()
        return out

    def _pre_forward(self, i: int) -> None:
        for g in self.unit_groups[i]:
            g.gather()
            g.install()
        if self.prefetch and i + 1 < len(self.unit_groups):
            for g in self.unit_groups[i + 1]:
                g.gather(async_op=True)

    def _post_forward(self, i: int, out: Any) -> None:
        for g in self.unit_groups[i]:
            g.free()
        if torch.is_grad_enabled():
            self._hook_outputs(out, lambda: self._pre_backward(i))

    # -- backward ------------------------------------------------------------------------
    def _hook_outputs(self, out: Any, fn: Any) -> None:
        """Call `fn` once, when the first gradient w.r.t. one of `out`'s tensors arrives."""
        tensors = [t for t in tree_flatten(out)[0] if isinstance(t, Tensor) and t.requires_grad]
        fired = [False]

        def hook(grad: Tensor) -> Tensor:
            if not fired[0]:
                fired[0] = True
                fn()
            return grad

        for t in tensors:
            t.register_hook(hook)

    def _on_backward(self) -> None:
        if not self._backward_queued:
            self._backward_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)

    def _pre_backward(self, i: int) -> None:
        self._on_backward()
        for g in self.unit_groups[i]:
            g.gather()
            g.wait()
        if self.prefetch and i > 0:
            for g in self.unit_groups[i - 1]:
                g.gather(async_op=True)

    def _end_backward(self) -> None:
        """After the whole backward: free what no gradient hook freed (frozen groups, units
        that took no gradient, the root in a backward that did not reach it)."""
        self._backward_queued = False
        for g in self._all_groups():
            g.free()

    # -- state ---------------------------------------------------------------------------
    def _all_groups(self) -> list[FlatGroup]:
        return [g for gs in (*self.unit_groups, self.root_groups) for g in gs]

    def unsharded_tensors(self) -> list[Tensor]:
        """The gathered buffers (storage of 0 bytes while freed), for memory measurement."""
        return [g.full for g in self._all_groups()]

    @torch.no_grad()
    def full_state_dict(self) -> dict[str, Tensor]:
        """Full fp32 parameters under the wrapped module's own names (every name of a tied
        parameter), plus its buffers. A collective: every rank must call it."""
        out: dict[str, Tensor] = {}
        for g in self._all_groups():
            flat = g.gather_fp32()
            for e in g.entries:
                value = flat[e.offset:e.offset + e.numel].view(e.shape).clone()
                for alias in self.aliases[e.name]:
                    out[alias] = value
        for name, buf in self.module.named_buffers():
            out[name] = buf.detach().clone()
        return out


__all__ = ["Entry", "FlatGroup", "FullyShardedDataParallel", "State"]
