"""Static device check: tensor factories on the rank side must say where the tensor goes.

On NCCL every rank computes on ``cuda:LOCAL_RANK``; a tensor made with ``torch.zeros(n)`` lands
on the CPU, and then a collective fails, or ``p.data = flat[...]`` silently moves a CUDA
parameter to the CPU. No GPU is here to show it, so this module reads the source instead: an
AST walk over the rank-side code that reports every call ``torch.F(...)``, F a tensor factory
(`FACTORIES`), with no ``device=`` argument, or with a literal ``device="cpu"`` (a host tensor
on purpose, which must then be in `ALLOWED` with the reason). ``*_like`` factories and
``x.new_*`` take the device of their input and are fine by construction.

Rank-side code (`rank_side_files`): the toolkit's modules that run inside ranks, the labs'
reference solutions and harnesses, and in the lessons' and playgrounds' code cells every rank
function (first two parameters ``rank, world_size``) with the notebook functions it calls.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FACTORIES = frozenset({
    "empty", "zeros", "ones", "full", "arange", "range", "linspace", "logspace", "eye",
    "rand", "randn", "randint", "randperm", "normal", "tensor", "as_tensor", "asarray",
    "from_numpy", "frombuffer", "empty_strided", "scalar_tensor", "tril_indices",
    "triu_indices", "sparse_coo_tensor",
})

# Toolkit modules that never run on a rank's data: pure math (cost and memory models, schedules,
# the planner's arithmetic), figures, widgets, results files, and the launcher's parent side.
HOST_ONLY = frozenset({
    "toolkit/cost/models.py", "toolkit/cost/fit.py", "toolkit/cost/choose.py",
    "toolkit/cost/results.py", "toolkit/memory/states.py", "toolkit/memory/activations.py",
    "toolkit/memory/shapes.py", "toolkit/memory/budget.py", "toolkit/planner/cluster.py",
    "toolkit/planner/layout.py", "toolkit/planner/plan.py", "toolkit/pipeline/schedules.py",
    "toolkit/cost/bubble.py", "toolkit/pipeline/simulate.py", "toolkit/pipeline/validate.py",
    "toolkit/data_parallel/fsdp_schedule.py", "toolkit/launch/launcher.py",
    "toolkit/launch/diagnose.py", "toolkit/launch/output.py", "toolkit/launch/rankproc.py",
    "toolkit/formats.py",
})

# (file, function) -> why that function's factories must make host tensors. Short on purpose:
# everything else takes its device from its data.
ALLOWED: dict[tuple[str, str], str] = {
    ("toolkit/checkpoint.py", "get_rng_state"):
        "numpy's RNG state saved into a checkpoint is host data (torch.from_numpy has no device)",
    ("toolkit/models.py", "make_regression_data"):
        "seeded draw from a CPU torch.Generator: the same numbers on every device (a CUDA "
        "generator gives others); moved to `device=` before returning",
    ("toolkit/models.py", "make_token_data"):
        "seeded draw from a CPU torch.Generator, as make_regression_data; moved to `device=`",
    ("toolkit/pipeline/token_layers.py", "SlicedAttention.__init__"):
        "seeded draw from a CPU torch.Generator, bitwise the same weights on every rank and "
        "device (as the tiny models); moved to `device=` at once",
    ("toolkit/tensor_parallel/layers.py", "_dense_init"):
        "the full dense weight from a CPU generator, bitwise the same on every rank and device "
        "(Megatron's CPU initialisation); each rank copies its slice onto its parameter's device",
    ("labs/02_ddp/harness.py", "make_data"):
        "seeded batch from a CPU generator, shared with the grader's single-process reference; "
        "micro_batches moves the rank's share to its device",
    ("labs/02_ddp/harness.py", "Toy.__init__"):
        "the toy model's buffer, drawn from the seeded global CPU RNG like its nn.Linear "
        "weights, so the grader's reference builds the same model; _train moves it to the device",
    ("labs/03_sharded_optimizer/harness.py", "make_data"):
        "seeded batch from a CPU generator, shared with the grader's float64 reference; "
        "local_batch moves the rank's slice to its device",
    ("labs/03_sharded_optimizer/harness.py", "Adam.step"):
        "the step counter stays a host scalar, as torch.optim.Adam keeps it when not capturable: "
        "Python reads it every step (float(step)), which on a GPU would force a sync each time",
    ("labs/05_tensor_parallel_mlp/harness.py", "_randn"):
        "seeded weights and inputs from a CPU generator, shared with the grader's dense "
        "reference (expected.py); _mine moves a rank's inputs to its device",
    ("toolkit/offload/store.py", "host_tensor"):
        "the offload tiers are host memory by definition: a file mapping seen as a tensor, or "
        "(pinned, with a GPU) host memory that the device copies to and from by DMA",
    ("lessons/12_tensor_parallel.ipynb", "randn"):
        "the lesson's seeded draws, the same on every rank and in the kernel's dense reference; "
        "rank functions move what they use to their device (on_rank)",
}


@dataclass(frozen=True)
class Finding:
    path: str
    function: str
    line: int
    factory: str

    def __str__(self) -> str:
        return (f"{self.path}, line {self.line}, in {self.function}: torch.{self.factory}(...) "
                "without device= (use device=<input>.device, a *_like factory, or "
                "toolkit.launch.device())")


def _literal_cpu(node: ast.AST) -> bool:
    """``"cpu"`` or ``torch.device("cpu")``: a host tensor on purpose."""
    if isinstance(node, ast.Constant):
        return node.value == "cpu"
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "device" and len(node.args) == 1
            and isinstance(node.args[0], ast.Constant) and node.args[0].value == "cpu")


def _unplaced_factory(node: ast.AST) -> str | None:
    """The factory name if `node` is ``torch.F(...)`` that does not say where (else None)."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"
            and node.func.attr in FACTORIES):
        return None
    for kw in node.keywords:
        if kw.arg == "device":
            return node.func.attr if _literal_cpu(kw.value) else None
    return node.func.attr


def _scan(tree: ast.AST, path: str, prefix: str = "") -> list[Finding]:
    """Every unplaced factory call in `tree`, named by its enclosing function's dotted name."""
    found: list[Finding] = []

    def visit(node: ast.AST, scope: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = scope
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = f"{scope}.{child.name}" if scope else child.name
            factory = _unplaced_factory(child)
            if factory is not None:
                found.append(Finding(path, scope or "<module>", child.lineno, factory))
            visit(child, inner)

    visit(tree, prefix)
    return found


def scan_module(path: Path) -> list[Finding]:
    rel = path.relative_to(ROOT).as_posix()
    return _scan(ast.parse(path.read_text(), filename=rel), rel)


def _cell_trees(path: Path) -> list[ast.Module]:
    """The code cells of a notebook, parsed (IPython magics and shell lines blanked, so line
    numbers stay the cell's); every function node gets ``cell``, its cell's index."""
    trees = []
    for index, cell in enumerate(json.loads(path.read_text())["cells"]):
        if cell["cell_type"] != "code":
            continue
        src = "".join(cell["source"])
        lines = ["" if ln.lstrip().startswith(("%", "!")) else ln for ln in src.splitlines()]
        tree = ast.parse("\n".join(lines))
        for node in ast.walk(tree):
            node.cell = index  # type: ignore[attr-defined]
        trees.append(tree)
    return trees


def _is_rank_function(fn: ast.AST) -> bool:
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    names = [a.arg for a in fn.args.posonlyargs + fn.args.args]
    return names[:2] == ["rank", "world_size"]


def rank_functions(path: Path) -> list[ast.FunctionDef]:
    """A notebook's rank functions and the notebook functions they call (transitively)."""
    trees = _cell_trees(path)
    top = {n.name: n for t in trees for n in t.body if isinstance(n, ast.FunctionDef)}
    chosen = [n for t in trees for n in ast.walk(t) if _is_rank_function(n)]
    seen = {id(n) for n in chosen}
    todo = list(chosen)
    while todo:
        fn = todo.pop()
        for node in ast.walk(fn):
            callee = top.get(node.id) if isinstance(node, ast.Name) else None
            if callee is not None and id(callee) not in seen:
                seen.add(id(callee))
                chosen.append(callee)
                todo.append(callee)
    return chosen


def scan_notebook(path: Path) -> list[Finding]:
    rel = path.relative_to(ROOT).as_posix()
    found: list[Finding] = []
    for fn in rank_functions(path):
        found += _scan(ast.Module(body=[fn], type_ignores=[]), f"{rel} cell {fn.cell}")
    return sorted(set(found), key=lambda f: (f.function, f.line))


GRADER_SIDE = ("checks.py", "expected.py", "layouts.py")
"""File names in a lab folder that only the grader runs (never in a rank)."""


def rank_side_files() -> tuple[list[Path], list[Path]]:
    """(modules, notebooks) holding rank-side code."""
    def rank_side(path: Path) -> bool:
        rel = path.relative_to(ROOT).as_posix()
        return rel not in HOST_ONLY and not rel.startswith(("toolkit/viz/", "toolkit/widgets/"))

    modules = [p for p in sorted((ROOT / "toolkit").rglob("*.py")) if rank_side(p)]
    # Labs: the reference solutions and the harness run in the ranks; checks.py, hidden/,
    # expected.py and layouts.py (inputs the grader builds from its secret; never copied into
    # the sandbox) are the grader's (CPU, trusted) side.
    modules += [p for p in sorted(ROOT.glob("labs/*/*.py")) if p.name not in GRADER_SIDE]
    notebooks = sorted(ROOT.glob("lessons/*.ipynb")) + sorted(ROOT.glob("labs/*/playground.ipynb"))
    return modules, notebooks


def all_findings() -> list[Finding]:
    modules, notebooks = rank_side_files()
    found = [f for p in modules for f in scan_module(p)]
    return found + [f for p in notebooks for f in scan_notebook(p)]
