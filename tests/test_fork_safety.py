"""No process of the course that forks ranks starts the CUDA driver first (issue 29).

On a GPU machine, `torch.cuda.is_available()` runs cuInit (and so does autograd's first
backward, asking for the device count); a child forked after that fails at its first CUDA call
("initialization error") or its first backward. The course counts GPUs through one function,
`toolkit.launch.gpus` (NVML and CUDA_VISIBLE_DEVICES, or a child interpreter), and forks only
while `driver_live()` says the driver is untouched. Checked here without a GPU:

* statically, no code of the course (toolkit, autograder, benchmarks, labs, tests, the lessons'
  cells) calls torch's driver-starting queries outside that module (a short allow-list, each
  entry with its reason);
* dynamically, with torch made to look like a CUDA build with one GPU (a fake NVML) and every
  driver-starting entry point raising when this process calls it: counting, placing, forking
  ranks that run a backward and Adam, and grading a lab all pass;
* the pieces: CUDA_VISIBLE_DEVICES as CUDA reads it, NVML's list filtered by it, the child
  interpreter's count where NVML cannot answer, `driver_live` on every answer libcuda gives, and
  the ctypes calls themselves against stand-ins for libnvidia-ml and libcuda built here.
"""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from toolkit.launch import gpus, resolve_placement, spawn
from toolkit.launch.gpus import GpuInfo, driver_live, parse_visible, visible_gpus

ROOT = Path(__file__).resolve().parents[1]
QUERIES = {"is_available", "device_count", "get_device_name", "get_device_properties",
           "get_device_capability", "mem_get_info", "is_bf16_supported", "get_arch_list"}
"""torch.cuda's questions about the GPUs: each starts the CUDA driver in the calling process,
`is_available` even while `torch.cuda.is_initialized()` stays False. Code that uses a GPU
(`set_device`, `current_device`, a CUDA tensor) is rank-side and not among them."""
DRIVER_CALLS = QUERIES | {"init", "_lazy_init", "current_device"}
"""What the launching process must never call (the dynamic check)."""
ALLOWED = {
    "toolkit/launch/gpus.py": "the one place that counts; calls torch only once the driver is "
                              "already live in this process",
    "benchmarks/gpu_figures.py": "a CUDA process of its own measuring the GPU; it forks nothing",
    "tests/test_fp8.py": "asks only inside a GPU rank (`_fp8_on_the_rank_device`), whose device "
                         "the launcher placed; the test process counts with gpu_count()",
}
SCANNED = ("toolkit", "autograder", "benchmarks", "labs", "tests")


def _driver_calls(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr in QUERIES
                and ast.unparse(node.value) in ("torch.cuda", "cuda")):
            found.append((node.lineno, ast.unparse(node)))
        if isinstance(node, ast.ImportFrom) and node.module == "torch.cuda":
            found += [(node.lineno, f"from torch.cuda import {a.name}") for a in node.names
                      if a.name in QUERIES]
    return found


def _sources():
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            yield path.relative_to(ROOT).as_posix(), path.read_text()
    for path in sorted((ROOT / "lessons").glob("*.ipynb")) + sorted(ROOT.glob("labs/*/*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        code = "\n".join("".join(line for line in c["source"] if not line.lstrip()
                                 .startswith(("%", "!")))
                         for c in cells if c["cell_type"] == "code")
        yield path.relative_to(ROOT).as_posix(), code


def test_only_the_gpus_module_asks_torch_about_gpus():
    found = []
    for name, source in _sources():
        if name in ALLOWED or name == "tests/test_fork_safety.py":
            continue
        try:
            tree = ast.parse(source)
        except SyntaxError:  # a fault fixture written not to compile: it never runs
            continue
        found += [f"{name}:{line}: {call}" for line, call in _driver_calls(tree)]
    assert found == [], ("these start the CUDA driver in a process that may fork ranks next; "
                         "count with toolkit.launch.gpu_count() instead:\n" + "\n".join(found))
    assert all((ROOT / name).is_file() for name in ALLOWED)


# -- a CUDA build with one GPU, whose driver must never start in this process -------------------

FAKE = [GpuInfo(0, "Fake H200", "GPU-0c0ffee0-aaaa", 141 << 30)]


@pytest.fixture
def cuda_machine(monkeypatch):
    """torch looks like a CUDA build on a one-GPU machine (NVML answers); every torch entry
    point that would start the driver raises if *this* process calls it (ranks it forks may:
    they are other processes, and a CPU rank there has its GPUs hidden)."""
    me = os.getpid()
    calls: list[str] = []

    def guard(name, real):
        def refuse(*args, **kwargs):
            if os.getpid() == me:
                calls.append(name)
                raise AssertionError(f"torch.cuda.{name}() called in the launching process")
            return real(*args, **kwargs)
        return refuse

    for name in DRIVER_CALLS:
        if hasattr(torch.cuda, name):
            monkeypatch.setattr(torch.cuda, name, guard(name, getattr(torch.cuda, name)))
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    monkeypatch.setattr(gpus, "_nvml_gpus", lambda: list(FAKE))
    monkeypatch.setattr(gpus, "count_in_child",
                        lambda env=None: pytest.fail("NVML answered: no child needed"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("TOOLKIT_DEVICE", raising=False)
    yield calls
    assert calls == []


def _train(rank, world_size):
    """A backward and an Adam step (Adam asks torch.cuda.is_available() on CUDA builds)."""
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    F.mse_loss(model(torch.randn(3, 4)), torch.zeros(3, 2)).backward()
    opt.step()
    env = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "PYTORCH_NVML_BASED_CUDA_CHECK")}
    return env, os.getppid()


@pytest.mark.multirank
def test_counting_placing_and_forking_never_start_the_driver(cuda_machine):
    assert gpus.cuda_build() and not driver_live()
    assert gpus.gpu_count() == 1 and [g.name for g in visible_gpus()] == ["Fake H200"]
    assert resolve_placement("auto", None, 2).kind == "cpu"  # 1 GPU < 2 ranks: CPU, as before
    assert resolve_placement("auto", None, 1).kind == "gpu"  # NCCL would take it at world size 1
    shared = resolve_placement("auto", "cuda", 4)
    assert (shared.backend, shared.kind, shared.gpus) == ("gloo", "shared", 1)
    assert [str(shared.device(r)) for r in range(4)] == ["cuda:0"] * 4
    out = spawn(_train, 2, timeout=60)
    for env, parent in out:
        assert parent == os.getpid()  # forked from here: the driver was provably untouched
        assert env == {"CUDA_VISIBLE_DEVICES": "", "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}


@pytest.mark.slow
@pytest.mark.multirank
def test_a_cpu_grade_on_a_gpu_machine_never_starts_the_driver(cuda_machine, tmp_path, capsys):
    from autograder.cli import main as cli

    before = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES",
                                             "PYTORCH_NVML_BASED_CUDA_CHECK")}
    try:
        code = cli(["grade", str(ROOT / "labs" / "01_collectives" / "collectives.py"), "--lab",
                    "01_collectives", "--json", str(tmp_path / "r.json"), "--no-color",
                    "--progress"])
    finally:
        for k, v in before.items():  # the command hides the GPUs in its own process
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    printed = capsys.readouterr()
    assert code == 0, printed.out[-2000:]
    assert json.loads((tmp_path / "r.json").read_text())["score"] == 100
    launches = [line for line in printed.err.splitlines() if " ranks]: " in line]
    assert len(launches) >= 11 and all(": ok at " in line for line in launches)  # --progress


def test_the_gpu_check_plans_without_starting_the_driver(cuda_machine):
    from autograder.sandbox.rank import load_module

    gpu_check = load_module(ROOT / "benchmarks" / "gpu_check.py", "gpu_check_fork_safety")
    plan = gpu_check.Plan.for_machine(quick=True)
    assert plan.gpus == 1 and plan.placement == "shared"


# -- the pieces --------------------------------------------------------------------------------

def test_cuda_visible_devices_is_read_as_cuda_reads_it():
    assert parse_visible(None) is None
    assert parse_visible("") == [] and parse_visible("-1") == []
    assert parse_visible("1,0") == [1, 0]
    assert parse_visible("0, 2,x,3") == [0, 2]  # the list ends at the first entry not a number
    assert parse_visible("0,1,0") == []  # a repeated entry hides every GPU
    assert parse_visible("GPU-ab,GPU-cd") == ["GPU-ab", "GPU-cd"]
    assert parse_visible("MIG-1,0") == ["MIG-1"]


def test_nvml_s_list_is_filtered_and_ordered_by_cuda_visible_devices(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    four = [GpuInfo(i, f"gpu{i}", f"GPU-{i}{i}{i}", 1) for i in range(4)]

    def names(value):
        env = {} if value is None else {"CUDA_VISIBLE_DEVICES": value}
        return [g.name for g in visible_gpus(env, nvml=lambda: four, child=pytest.fail)]

    assert names(None) == ["gpu0", "gpu1", "gpu2", "gpu3"]
    assert names("2,0") == ["gpu2", "gpu0"]
    assert names("1,7,2") == ["gpu1"]  # past the last GPU: the list ends
    assert names("GPU-33,GPU-1") == ["gpu3", "gpu1"]  # UUID prefixes
    assert names("") == []


def test_without_nvml_a_child_interpreter_counts_once_per_setting(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(gpus, "_child_counts", {})
    asked = []

    def child(env):
        asked.append(env.get("CUDA_VISIBLE_DEVICES"))
        return 2

    no_nvml = lambda: None  # noqa: E731
    assert len(visible_gpus({}, nvml=no_nvml, child=child)) == 2
    assert len(visible_gpus({}, nvml=no_nvml, child=child)) == 2
    assert len(visible_gpus({"CUDA_VISIBLE_DEVICES": "MIG-x"}, nvml=pytest.fail,
                            child=child)) == 2  # MIG: NVML's list does not apply
    assert asked == [None, "MIG-x"]


def test_a_cpu_build_counts_nothing_and_a_real_child_agrees():
    assert not gpus.cuda_build() or pytest.skip("a CUDA build of torch")
    assert gpus.gpu_count() == 0 and visible_gpus() == [] and not driver_live()
    assert gpus.count_in_child() == 0  # a fresh interpreter asking torch itself


def test_driver_live_reads_libcuda_without_loading_it(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    lib = "7f00-7f10 r-xp 0 fd:01 42 /usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06\n"
    other = "7f00-7f10 r-xp 0 fd:01 43 /usr/lib/libc.so.6\n"
    assert not driver_live(maps=other, status=pytest.fail)  # not loaded: cannot be live
    assert not driver_live(maps=other + lib, status=lambda: 3)  # CUDA_ERROR_NOT_INITIALIZED
    assert driver_live(maps=lib, status=lambda: 0)  # cuInit has run here
    assert driver_live(maps=lib, status=lambda: None)  # loaded under another name: assume so
    monkeypatch.setattr(torch.version, "cuda", None)
    assert not driver_live(maps=lib, status=lambda: 0)  # a CPU build has no driver to start


def test_fork_is_refused_and_auto_spawns_once_the_driver_is_live(monkeypatch):
    from toolkit.launch.spawn_arguments import choose_start_method

    monkeypatch.setattr(gpus, "driver_live", lambda **_: True)
    assert choose_start_method("auto", "gloo") == "spawn"
    with pytest.raises(ValueError, match="CUDA driver already initialised"):
        choose_start_method("fork", "gloo")
    monkeypatch.setattr(gpus, "driver_live", lambda **_: False)
    assert choose_start_method("auto", "gloo") == "fork"
    assert choose_start_method("auto", "nccl") == "spawn"


# -- the ctypes paths, against stand-ins for NVIDIA's libraries (built here with the C compiler) --

FAKE_NVML = r"""
#include <string.h>
typedef struct { unsigned long long total, free, used; } mem_t;
int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
int nvmlDeviceGetCount_v2(unsigned int *n) { *n = 2; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **h) {
    *h = (void *)(long)(i + 1); return 0; }
int nvmlDeviceGetName(void *h, char *s, unsigned int n) {
    strncpy(s, (long)h == 1 ? "Fake A" : "Fake B", n); return 0; }
int nvmlDeviceGetUUID(void *h, char *s, unsigned int n) {
    strncpy(s, (long)h == 1 ? "GPU-aa" : "GPU-bb", n); return 0; }
int nvmlDeviceGetMemoryInfo(void *h, mem_t *m) {
    m->total = 80ULL << 30; m->free = m->used = 0; return 0; }
"""
FAKE_CUDA = r"""
static int initialised = 0;
int cuInit(unsigned int flags) { initialised = 1; return 0; }
int cuDeviceGetCount(int *count) { if (!initialised) return 3; *count = 1; return 0; }
"""


def _build(tmp_path: Path, source: str, soname: str) -> Path:
    import shutil
    import subprocess

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the stand-in library")
    (tmp_path / "fake.c").write_text(source)
    lib = tmp_path / soname
    subprocess.run([cc, "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(lib),
                    str(tmp_path / "fake.c")], check=True, capture_output=True)
    return lib


def test_nvml_is_read_through_ctypes(tmp_path):
    lib = _build(tmp_path, FAKE_NVML, "libnvidia-ml.so.1")
    assert gpus.Nvml(str(lib)).gpus() == [GpuInfo(0, "Fake A", "GPU-aa", 80 << 30),
                                          GpuInfo(1, "Fake B", "GPU-bb", 80 << 30)]


def test_driver_live_asks_a_loaded_libcuda_and_never_loads_one(tmp_path):
    import subprocess
    import sys

    lib = _build(tmp_path, FAKE_CUDA, "libcuda.so.1")
    code = f"""
import ctypes, torch
from toolkit.launch import gpus
torch.version.cuda = "13.0"                  # as a CUDA build would say
seen = [gpus._cuda_device_count_status(), gpus.driver_live()]
cuda = ctypes.CDLL({str(lib)!r})             # what cudart does at its first call
seen += [gpus._cuda_device_count_status(), gpus.driver_live()]
cuda.cuInit(0)
seen += [gpus._cuda_device_count_status(), gpus.driver_live()]
print(seen)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout
    assert out.strip() == "[None, False, 3, False, 0, True]"
