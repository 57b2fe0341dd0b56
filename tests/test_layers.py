"""The toolkit's layers hold: every import between its packages follows the rules written in
docs/architecture.md ("Layers and import rules"), read from the source with `ast`.

Checked for every module under toolkit/: each toolkit import it makes (at any depth) is allowed
for its layer; toolkit imports sit at module level only (an import inside a function would only
hide a cycle or a layering break); the packages import one another without a cycle; the pure
layers (base, models, viz) import no process or communication machinery. A new top-level
module or package must be given a layer in `LAYER` below (and in the document).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOLKIT = ROOT / "toolkit"

LAYER = {
    "toolkit": "base", "chunks": "base", "arguments": "base", "models": "base",
    "comm": "comm",
    "launch": "launch",
    "cost": "models", "memory": "models", "flops": "models", "planner": "models",
    "formats": "models", "roofline": "models", "hub": "models", "framework_settings": "models",
    "collectives": "algorithms", "data_parallel": "algorithms", "pipeline": "algorithms",
    "tensor_parallel": "algorithms", "context_parallel": "algorithms",
    "checkpoint": "algorithms", "recompute": "algorithms", "offload": "algorithms",
    "precision": "algorithms", "expert_parallel": "algorithms",
    "experiments": "experiments", "exercises": "experiments",
    "frameworks": "frameworks",
    "viz": "viz",
    "widgets": "widgets",
}
"""Top-level name under toolkit -> its layer (docs/architecture.md, "Layers and import rules")."""

MAY_IMPORT = {
    "base": {"base"},
    "comm": {"comm"},
    "launch": {"launch", "comm"},
    "models": {"base", "models"},
    "algorithms": {"base", "comm", "launch", "models", "algorithms"},
    "experiments": {"base", "comm", "launch", "models", "algorithms", "frameworks",
                    "experiments"},
    "frameworks": {"base", "comm", "algorithms", "frameworks"},
    "viz": {"base", "comm", "models", "viz"},
    "widgets": {"base", "models", "algorithms", "viz", "widgets"},
}
WHY = {
    "base": "base modules (chunks, arguments, the tiny models) import only each other",
    "comm": "the recorder imports nothing from the toolkit (the grader's sandbox lets ranks read "
            "toolkit.launch, toolkit.comm and toolkit/arguments.py only)",
    "launch": "the launcher imports only the recorder (the grader's sandbox lets ranks read "
              "toolkit.launch, toolkit.comm and toolkit/arguments.py only)",
    "models": "the models (cost, memory, flops, planner) are pure numbers: they start no process "
              "and import no algorithm, launcher or recorder",
    "algorithms": "algorithms run inside ranks; what runs them and compares with a model is "
                  "toolkit.experiments, and figures are toolkit.viz",
    "experiments": "experiments sit under viz and widgets",
    "frameworks": "the course's code inside PyTorch Lightning runs in ranks like an algorithm; "
                  "what starts processes is toolkit.experiments.frameworks",
    "viz": "figures are pure functions of data: they may read the recorder's types and the "
           "models' numbers, never run an algorithm or start ranks",
    "widgets": "widgets wire sliders to pure views: they start no ranks (no launch, no "
               "experiments)",
}
PROCESS_MACHINERY = ("subprocess", "multiprocessing", "torch.multiprocessing",
                     "torch.distributed", "psutil")
PURE = ("base", "models", "viz")
LIGHTNING = ("pytorch_lightning", "lightning", "lightning_fabric")
"""Top-level names of PyTorch Lightning's packages (seconds to import)."""
LIGHTNING_USERS = {"toolkit.frameworks": {"toolkit.experiments.frameworks"},
                   "toolkit.experiments.frameworks": set()}
"""The only modules that import Lightning, and the only toolkit modules that may import each of
them: no other lesson, lab or test pays for Lightning's import (lesson 16 does)."""


def module_name(path: Path) -> str:
    name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    return name.removesuffix(".__init__")


def is_module(dotted: str) -> bool:
    parts = dotted.split(".")
    base = ROOT.joinpath(*parts)
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def imports(path: Path) -> list[tuple[str, int, bool]]:
    """(imported module, line, at module level) for every import in `path`; for
    ``from P import n`` the module P.n when it is one, else P."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top = {id(node) for node in tree.body}
    for node in tree.body:  # imports under a module-level `if TYPE_CHECKING:` count as top
        if isinstance(node, ast.If):
            top |= {id(n) for n in node.body}
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno, id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1])
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            for a in node.names:
                target = f"{source}.{a.name}"
                out.append((target if is_module(target) else source, node.lineno,
                            id(node) in top))
    return out


def top_name(dotted: str) -> str:
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def toolkit_files() -> list[Path]:
    return sorted(TOOLKIT.rglob("*.py"))


def test_every_top_level_module_has_a_layer():
    names = {top_name(module_name(p)) for p in toolkit_files()}
    missing = sorted(names - set(LAYER))
    assert not missing, (f"toolkit modules without a layer: {missing}; add each to LAYER in "
                         f"tests/test_layers.py and to docs/architecture.md")


def violations() -> list[str]:
    found = []
    for path in toolkit_files():
        me = module_name(path)
        layer = LAYER[top_name(me)]
        rel = path.relative_to(ROOT)
        for target, line, at_top in imports(path):
            if target == "toolkit" or target.startswith("toolkit."):
                theirs = LAYER.get(top_name(target))
                if theirs is None:
                    found.append(f"{rel}:{line} imports {target}, which has no layer")
                elif theirs not in MAY_IMPORT[layer]:
                    found.append(f"{rel}:{line} imports {target} ({theirs}): a {layer} module "
                                 f"may import only {sorted(MAY_IMPORT[layer])}; {WHY[layer]}")
                if not at_top:
                    found.append(f"{rel}:{line} imports {target} inside a function: toolkit "
                                 f"imports go at the top of the module (a late import hides a "
                                 f"cycle or a layering break)")
            elif layer in PURE and target.startswith(PROCESS_MACHINERY):
                found.append(f"{rel}:{line} imports {target}: a {layer} module starts no process "
                             f"and sends no message ({WHY[layer]})")
    return found


def test_imports_follow_the_layer_rules():
    found = violations()
    assert not found, "layer rules broken (docs/architecture.md):\n" + "\n".join(found)


def package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in toolkit_files():
        me = top_name(module_name(path))
        for target, _, _ in imports(path):
            if target.startswith("toolkit.") and top_name(target) != me:
                graph.setdefault(me, set()).add(top_name(target))
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as a path [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_packages_import_one_another_without_a_cycle():
    cycle = find_cycle(package_graph())
    assert cycle is None, f"import cycle between toolkit packages: {' -> '.join(cycle)}"


def lightning_violations() -> list[str]:
    found = []
    for path in toolkit_files():
        me = module_name(path)
        rel = path.relative_to(ROOT)
        for target, line, _ in imports(path):
            if target.split(".")[0] in LIGHTNING and me not in LIGHTNING_USERS:
                found.append(f"{rel}:{line} imports {target}: only {sorted(LIGHTNING_USERS)} "
                             f"import Lightning, so that no other module pays its import time")
            for module, allowed in LIGHTNING_USERS.items():
                if (target == module or target.startswith(module + ".")) and me != module \
                        and me not in allowed:
                    found.append(f"{rel}:{line} imports {target}, which imports Lightning: "
                                 f"only {sorted(allowed) or 'no toolkit module'} may")
    return found


def test_only_the_framework_modules_import_lightning():
    found = lightning_violations()
    assert not found, "Lightning imported outside its two modules:\n" + "\n".join(found)


# -- the checks can fail -------------------------------------------------------------------------

def test_the_rules_catch_a_model_importing_an_algorithm_a_late_import_and_a_cycle(tmp_path,
                                                                                   monkeypatch):
    pkg = tmp_path / "toolkit"
    (pkg / "cost").mkdir(parents=True)
    (pkg / "pipeline").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "pipeline" / "__init__.py").write_text("from ..cost import bubble\n")
    (pkg / "cost" / "__init__.py").write_text("")
    (pkg / "cost" / "bubble.py").write_text(
        "import subprocess\nfrom ..pipeline import executor\n\n\ndef f():\n"
        "    from .. import pipeline\n")
    (pkg / "pipeline" / "executor.py").write_text("")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    monkeypatch.setattr(__import__(__name__), "TOOLKIT", pkg)
    found = "\n".join(violations())
    assert ("toolkit/cost/bubble.py:2 imports toolkit.pipeline.executor (algorithms): a models "
            "module may import only ['base', 'models']") in found
    assert "toolkit/cost/bubble.py:6 imports toolkit.pipeline inside a function" in found
    assert "toolkit/cost/bubble.py:1 imports subprocess: a models module starts no process" in found
    assert find_cycle(package_graph()) == ["cost", "pipeline", "cost"]


def test_the_lightning_rule_catches_a_module_that_imports_it(tmp_path, monkeypatch):
    pkg = tmp_path / "toolkit"
    (pkg / "experiments").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "frameworks.py").write_text("import pytorch_lightning\n")
    (pkg / "experiments" / "__init__.py").write_text("from .. import frameworks\n")
    (pkg / "experiments" / "frameworks.py").write_text("from ..frameworks import x\n")
    (pkg / "memory.py").write_text("from lightning.pytorch import Trainer\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    monkeypatch.setattr(__import__(__name__), "TOOLKIT", pkg)
    found = "\n".join(lightning_violations())
    assert "toolkit/memory.py:1 imports lightning.pytorch: only" in found
    assert ("toolkit/experiments/__init__.py:1 imports toolkit.frameworks, which imports "
            "Lightning") in found
    assert "experiments/frameworks.py" not in found and "toolkit/frameworks.py" not in found


@pytest.mark.parametrize("graph, cycle", [
    ({"a": {"b"}, "b": {"c"}}, None),
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"]),
])
def test_find_cycle(graph, cycle):
    assert find_cycle(graph) == cycle
