"""Lab 03's inputs and rank-side calls: how each check calls the student's code.

Imported by the grader, which makes every rank's inputs (`make_inputs`: the model's initial
weights and that rank's slice of the batch) from a seed derived from the grade's secret, and
copied into the sandbox (as `_lab_harness`), where each rank receives its own inputs alone and
builds the model's layers from the case's public widths. Holds no answers: models are plain
``nn.Linear``/``nn.LeakyReLU`` stacks.

A case is a dict: ``world_size``, ``seed``, ``dims`` (layer widths, e.g. [7, 5, 3]),
``frozen`` (names of parameters with requires_grad=False), ``optimizer`` ("sgd" or "adam"),
``steps``, ``release`` (FSDP: measure what is held after the first forward); for the bounds
call, ``sizes`` (numel values).
"""

from __future__ import annotations

import gc
import itertools
import sys
import warnings

import torch
import torch.nn.functional as F
from torch import nn

BATCH = 12  # divisible by 1, 2, 3 and 4 ranks: every rank gets an equal slice


class SGD:
    """torch.optim.SGD's update (momentum buffer = grad on the first step, then
    μ·buf + grad; p −= lr·buf) with its constructor and ``state``, but not its class: building a
    torch optimizer imports torch._dynamo, seconds in every freshly forked rank. The grader's
    reference trains with torch.optim itself, so any difference would show."""

    def __init__(self, params, lr: float, momentum: float = 0.0) -> None:
        self.params, self.lr, self.momentum = list(params), lr, momentum
        self.state: dict = {}

    @torch.no_grad()
    def step(self) -> None:
        for p in self.params:
            if p.grad is None:
                continue
            d = p.grad
            if self.momentum:
                buf = self.state.get(p, {}).get("momentum_buffer")
                buf = d.clone() if buf is None else buf.mul_(self.momentum).add_(d)
                self.state[p] = {"momentum_buffer": buf}
                d = buf
            p.add_(d, alpha=-self.lr)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None


class Adam(SGD):
    """torch.optim.Adam's update (bias-corrected averages, ε added to √v̂), same caveat."""

    def __init__(self, params, lr: float, betas=(0.9, 0.999), eps: float = 1e-8) -> None:
        super().__init__(params, lr)
        self.betas, self.eps = betas, eps

    @torch.no_grad()
    def step(self) -> None:
        b1, b2 = self.betas
        for p in self.params:
            if p.grad is None:
                continue
            st = self.state.setdefault(p, {"step": torch.tensor(0.0),
                                           "exp_avg": torch.zeros_like(p),
                                           "exp_avg_sq": torch.zeros_like(p)})
            st["step"] += 1
            t = float(st["step"])
            st["exp_avg"].lerp_(p.grad, 1 - b1)
            st["exp_avg_sq"].mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
            denom = (st["exp_avg_sq"].sqrt() / (1 - b2 ** t) ** 0.5).add_(self.eps)
            p.addcdiv_(st["exp_avg"], denom, value=-self.lr / (1 - b1 ** t))


# name -> (class the ranks use, torch class the grader's reference uses, options)
OPTIMIZERS = {"sgd": (SGD, torch.optim.SGD, dict(lr=0.1, momentum=0.9)),
              "adam": (Adam, torch.optim.Adam, dict(lr=1e-2)),
              "plain_sgd": (SGD, torch.optim.SGD, dict(lr=0.1))}  # FSDP: the shards' optimizer


SLOPE = 0.1  # every layer passes some gradient back, whatever the seed


def _stream(case: dict, *labels: str | int) -> int:
    """The seed of the case's stream named `labels` (`autograder.seeds`: a hash of the case's
    seed and the labels). Grader side: the case a rank sees has no seed, and a rank only builds
    the architecture (0: its weights come from its inputs) without importing the grader's
    modules."""
    if "seed" not in case:
        return 0
    from autograder.seeds import stream_seed  # grader side only

    return stream_seed(int(case["seed"]), *labels)


def make_model(case: dict) -> nn.Sequential:
    """Linear layers of widths ``dims`` with a leaky ReLU (`SLOPE`) between them, drawn from
    the case's stream "model"; ``frozen`` names (state-dict style, e.g. "0.bias") get
    requires_grad=False. With a plain ReLU 2 seeds in 1,000 of the (3, 4, 4, 2) case left a
    layer dead on the whole batch: its gradient was zero, so a wrong gradient shard of it could
    not show in the values."""
    torch.manual_seed(_stream(case, "model"))
    dims = case["dims"]
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
        if i:
            layers.append(nn.LeakyReLU(SLOPE))
        layers.append(nn.Linear(a, b))
    model = nn.Sequential(*layers)
    for name, p in model.named_parameters():
        if name in case.get("frozen", ()):
            p.requires_grad_(False)
    return model


def make_data(case: dict) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(_stream(case, "data"))
    dims = case["dims"]
    return torch.randn(BATCH, dims[0], generator=g), torch.randn(BATCH, dims[-1], generator=g)


def local_batch(case: dict, rank: int, world_size: int,
                on: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Rank's slice of the batch (drawn on the CPU, as the grader's reference), on device `on`."""
    x, y = (t.to(on) for t in make_data(case))
    n = BATCH // world_size
    return x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]


def make_inputs(case: dict, world_size: int) -> list:
    """Per rank: the model's initial state and the rank's slice of the batch."""
    if "dims" not in case:  # the pure functions' case: no model, no data
        return [None] * world_size
    state = make_model(case).state_dict()
    return [{"state": state, "batch": local_batch(case, r, world_size)}
            for r in range(world_size)]


def _model(call) -> nn.Sequential:
    """The case's model on this rank's device, with the weights the grader sent."""
    model = make_model(call.case).to(call.device)
    model.load_state_dict(call.inputs["state"])
    return model


def _state_elements(optimizer) -> int:
    """Elements of the optimizer's per-element state (distinct storages of tensors with at least
    one dimension: momentum, Adam's averages; not its 0-dim step counters), whatever their
    dtype (a float64 master shard holds as many as a float32 one). -1: no optimizer."""
    if not isinstance(getattr(optimizer, "state", None), dict):
        return -1
    seen = {}
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                storage = value.untyped_storage()
                seen[storage.data_ptr()] = storage.nbytes() // value.element_size()
    return sum(seen.values())


def _bounds(student, call):
    out = []
    for n in call.case["sizes"]:
        for p in (1, 2, 3, 4):
            rows = [[int(v) for v in student.shard_bounds(n, p, r)] for r in range(p)]
            flat = student.flatten_padded([torch.arange(n, dtype=torch.float32,
                                                        device=call.device)], p)
            out.append({"numel": n, "world_size": p, "bounds": rows, "flat": flat})
    return out


def _zero(student, call):
    model = _model(call)
    optimizer_class, _, options = OPTIMIZERS[call.case.get("optimizer", "sgd")]
    opt = student.ShardedOptimizer(model.parameters(), optimizer_class, **options)
    x, y = (t.to(call.device) for t in call.inputs["batch"])
    for _ in range(call.case.get("steps", 3)):
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
    return {"params": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "state_elements": _state_elements(getattr(opt, "optimizer", None))}


def _fsdp_model(student, call) -> nn.Sequential:
    return nn.Sequential(*[student.FSDPLinear(m, call.world_size, call.rank)
                           if isinstance(m, nn.Linear) else m for m in _model(call)])


def _as(storage, dtype: torch.dtype, shift: int) -> torch.Tensor | None:
    """A storage's bytes from `shift` on, read as `dtype` (a flat tensor on its device)."""
    item = dtype.itemsize
    count = (storage.nbytes() - shift) // item
    if count <= 0:
        return None
    raw = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
    part = raw[shift:shift + count * item]
    return (part.clone() if shift else part).view(dtype)  # a view needs aligned elements


def occurs(values: torch.Tensor, pattern: torch.Tensor) -> bool:
    """Whether flat `pattern` appears in flat `values` as a contiguous run, exactly. Every start
    is a candidate; candidates are narrowed one pattern element at a time (O(len(values)) per
    element while any survive), so decoys that repeat the first values cost no more."""
    n, m = values.numel(), pattern.numel()
    if m == 0 or n < m:
        return m == 0
    alive = values[:n - m + 1] == pattern[0]
    for j in range(1, m):
        if not bool(alive.any()):
            return False
        alive &= values[j:j + n - m + 1] == pattern[j]
    return bool(alive.any())


def _contains(storage, patterns: list[torch.Tensor]) -> bool:
    """Whether a storage holds one of `patterns` (flat tensors of one dtype) anywhere in it, at
    any byte offset (a unit's gathered flat vector, a view of its weight, bytes kept at an odd
    offset or after decoys). Storages freed in place (resize_(0), as torch FSDP releases) hold
    nothing."""
    try:
        if storage.device.type == "meta" or not patterns:
            return False
        dtype = patterns[0].dtype
        smallest = min(t.numel() for t in patterns) * dtype.itemsize
        if storage.nbytes() < smallest:
            return False
        patterns = [t.to(storage.device) for t in patterns]
        for shift in range(dtype.itemsize):
            values = _as(storage, dtype, shift)
            if values is not None and any(occurs(values, t) for t in patterns):
                return True
    except (RuntimeError, TypeError, NotImplementedError):
        return False
    return False


def _storage(o):
    """The storage behind a tensor (a dense copy of a sparse or mkldnn one), a storage object
    or a numpy array."""
    if isinstance(o, torch.Tensor):
        if o.is_meta:
            return None
        return (o if o.layout == torch.strided else o.to_dense()).untyped_storage()
    if isinstance(o, torch.UntypedStorage):
        return o
    if isinstance(o, torch.TypedStorage):
        return o.untyped()
    np = sys.modules["numpy"]
    if o.dtype.kind not in "fiub":
        return None
    flat = np.ascontiguousarray(o).view(np.uint8).reshape(-1)
    if not flat.flags.writeable:  # DLPack exports writeable arrays only: read a copy
        flat = flat.copy()
    return torch.from_dlpack(flat).untyped_storage()  # host memory, where the array is


def _live_storages() -> list:
    """Every storage this process's garbage collector reaches, after a collection, each once:
    behind any tensor, storage object or numpy array it tracks or that a tracked object refers
    to directly (a ctx attribute, a list, a closure, a dict)."""
    kinds = (torch.Tensor, torch.UntypedStorage, torch.TypedStorage)
    if "numpy" in sys.modules:
        kinds += (sys.modules["numpy"].ndarray,)
    gc.collect()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # isinstance on deprecated torch names warns
        tracked = gc.get_objects()
        # one isinstance per object (about a million here): the filter, then the few hits
        hits = [o for o in itertools.chain(tracked, gc.get_referents(*tracked))
                if isinstance(o, kinds)]
        del tracked
        found = {}
        for o in hits:
            try:
                storage = _storage(o)
            except (RuntimeError, TypeError, ValueError, NotImplementedError):
                continue
            if storage is not None:  # many views of one storage: searched once
                found.setdefault((storage.data_ptr(), storage.nbytes()), storage)
        return list(found.values())


def _unit_patterns(weight: torch.Tensor) -> list[torch.Tensor]:
    """What a rank must not hold anywhere after forward, for one unit: its full weight, as is
    and transposed. Other ranks' chunks are searched for only on the unit (`_unit_buffers`):
    S elements are few enough that a live buffer elsewhere reusing freed memory (never written
    since) can hold one by chance."""
    return [weight.reshape(-1), weight.t().reshape(-1)]


def _others_chunks(weight: torch.Tensor, bias: torch.Tensor, p: int, rank: int):
    """The other ranks' chunks of the unit's flat (weight, bias) vector, padding left out."""
    flat = torch.cat([weight.detach().reshape(-1), bias.detach().reshape(-1)])
    size = -(-flat.numel() // p)
    chunks = [flat[k * size:(k + 1) * size] for k in range(p) if k != rank]
    return [c for c in chunks if c.numel()], size


def _attributes(value, depth: int = 3):
    """Tensors and storages in a unit attribute, into lists, tuples and dicts (depth 3)."""
    if isinstance(value, (torch.Tensor, torch.UntypedStorage, torch.TypedStorage)):
        yield value
    elif depth and isinstance(value, dict):
        for v in list(value.values())[:1000]:
            yield from _attributes(v, depth - 1)
    elif depth and isinstance(value, (list, tuple)):
        for v in list(value)[:1000]:
            yield from _attributes(v, depth - 1)


def _unit_buffers(unit, weight: torch.Tensor, bias: torch.Tensor, p: int, rank: int) -> list:
    """Storages the unit keeps in its attributes (into lists, tuples and dicts, ``_parameters``
    included), other than its shard, that hold another rank's chunk of its parameters (the
    list form's parts kept after release, its own slot or not) or are a gather buffer that
    "release" only zeroed (all zero, at least p·S elements: a buffer as large as the gathered
    unit). An activation kept on the unit
    (x for backward) holds neither."""
    chunks, size = _others_chunks(weight, bias, p, rank)
    mine = unit.shard.untyped_storage().data_ptr()
    found = {}
    for value in vars(unit).values():
        for o in _attributes(value):
            storage = _storage(o)
            if storage is None or storage.data_ptr() == mine or not storage.nbytes():
                continue
            zeroed = (storage.nbytes() >= p * size * weight.element_size()
                      and not bool(_as(storage, torch.uint8, 0).any()))
            if zeroed or _contains(storage, chunks):
                found[storage.data_ptr()] = storage
    return list(found.values())


def _held_after_forward(model: nn.Sequential, x: torch.Tensor, dense: list[nn.Linear],
                        mine: list[torch.Tensor], rank: int, world_size: int):
    """(bytes, whether a unit's shard is among them) of gathered parameters still alive after
    the first forward: any live storage (saved for backward, or behind a tensor, a storage or a
    numpy array anywhere the garbage collector sees) that holds a unit's full weight, as is or
    transposed (`_unit_patterns`, values known before training), and what the unit keeps in
    its attributes that holds other ranks' chunks or is a zeroed gather buffer
    (`_unit_buffers`). `mine`: the
    harness's own tensors with those values (the grader's inputs and `dense`), not counted. A
    copy in another form (a list of floats, another dtype, negated) is not seen: this catches
    the ordinary mistakes (a gathered weight saved for backward, gathered parts kept, a buffer
    zeroed instead of freed)."""
    saved: list[torch.Tensor] = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(x)
    units = [m for m in model if hasattr(m, "shard")]
    patterns = [t for m in dense for t in _unit_patterns(m.weight.detach())]
    ours = {t.untyped_storage().data_ptr() for t in mine + patterns}  # the search's own too
    held = {}
    for storage in [t.untyped_storage() for t in saved] + _live_storages():
        key = storage.data_ptr()
        if key in ours or key in held or storage.nbytes() == 0:
            continue
        if _contains(storage, patterns):
            held[key] = storage.nbytes()
    for unit, m in zip(units, dense):
        for storage in _unit_buffers(unit, m.weight, m.bias, world_size, rank):
            if storage.data_ptr() not in ours:
                held[storage.data_ptr()] = storage.nbytes()
    shard_view = any(u.shard.untyped_storage().data_ptr() in held for u in units)
    return out, sum(held.values()), shard_view


def _fsdp(student, call):
    model = _fsdp_model(student, call)
    units = [m for m in model if hasattr(m, "shard")]
    init_shards = [u.shard.detach().clone() for u in units]
    dense = [m for m in _model(call) if isinstance(m, nn.Linear)]
    opt = SGD([u.shard for u in units], **OPTIMIZERS["plain_sgd"][2])
    x, y = (t.to(call.device) for t in call.inputs["batch"])
    held = shard_view = None
    for step in range(call.case.get("steps", 2)):
        opt.zero_grad()
        if step == 0 and call.case.get("release"):  # the walk costs ~0.5 s: where judged
            mine = [t for m in dense for t in (m.weight, m.bias)] + \
                list(call.inputs["state"].values())
            out, held, shard_view = _held_after_forward(model, x, dense, mine, call.rank,
                                                        call.world_size)
        else:
            out = model(x)
        F.mse_loss(out, y).backward()
        opt.step()
    return {"init_shards": init_shards, "shards": [u.shard.detach().clone() for u in units],
            "held_after_forward": held, "held_shard_view": shard_view}


def _fsdp_state(student, call):
    model = _fsdp_model(student, call)
    units = [m for m in model if hasattr(m, "shard")]
    opt = SGD([u.shard for u in units], **OPTIMIZERS["plain_sgd"][2])
    x, y = (t.to(call.device) for t in call.inputs["batch"])
    opt.zero_grad()
    F.mse_loss(model(x), y).backward()
    opt.step()
    return [u.full_state_dict() for u in units]


CALLS = {"bounds": _bounds, "zero": _zero, "fsdp": _fsdp, "fsdp_state": _fsdp_state}
