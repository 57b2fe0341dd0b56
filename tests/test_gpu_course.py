"""The course on the GPUs: every lesson top to bottom, and every lab's reference solution
through its harness. Runs on one GPU (the ranks share it) as on several (NCCL, a GPU per rank);
skipped without a GPU.

Labs: each check's cases run the lab's harness call with the reference solution on the GPUs
(``device="cuda"``) and on the CPU; the outputs must agree (tensors to 1e-5, counts and bytes
exactly; wall-clock timestamps, the floats above 1e9 in lab 02's overlap records, differ by
nature and are skipped). With the GPUs shared, each lab's smallest multi-rank world size runs
(the placement is the same at every size; the grading step of `make gpu-check` grades all of
them). Judging those outputs on GPUs is the grader's business (`autograder grade --device`),
not this file's. Lessons: ``TOOLKIT_DEVICE=cuda`` in the kernel's environment runs every launch
on the GPUs (NCCL with a GPU per rank, else shared), the deadlock demonstrations on gloo.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from autograder.lab import load_lab
from toolkit.launch import context, gpu_count, spawn
from notebooks import execute

ROOT = Path(__file__).resolve().parents[1]
LABS = sorted(p.parent for p in (ROOT / "labs").glob("*/checks.py"))
LESSONS = sorted((ROOT / "lessons").glob("[0-9][0-9]_*.ipynb"))
LESSON_RANKS = 4  # the most ranks a lesson starts at once

pytestmark = [pytest.mark.gpu, pytest.mark.multirank, pytest.mark.slow,
              pytest.mark.skipif(gpu_count() < 1, reason="needs a CUDA GPU")]


def lab_calls(rank: int, world_size: int, lab_dir: str, student_file: str, calls: list) -> dict:
    """In a rank: the reference solution through the lab's harness, as the sandbox calls it
    (a `Call` with this rank's inputs and device; no courier here, so marks go nowhere)."""
    from autograder.sandbox.probe import Call
    from autograder.sandbox.rank import load_module  # as the sandbox's ranks load them

    harness = load_module(Path(lab_dir) / "harness.py", "_lab_harness")
    reference = load_module(Path(lab_dir) / student_file, Path(student_file).stem)
    where = str(context().device)
    outputs = [harness.CALLS[call](reference, Call(rank, world_size, case,
                                                   harness.make_inputs(case, world_size)[rank],
                                                   device=where))
               for call, case in calls]
    return {"backend": context().backend, "device": where, "outputs": outputs}


def _same(a, b, where: str) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.device.type == b.device.type == "cpu", where
        assert a.shape == b.shape and a.dtype == b.dtype, where
        assert torch.allclose(a.double(), b.double(), rtol=1e-5, atol=1e-5, equal_nan=True), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and a > 1e9:
        assert isinstance(b, float) and b > 1e9, where  # a timestamp: when, not what
    else:
        assert a == b, f"{where}: {a!r} on the GPUs, {b!r} on the CPU"


@pytest.mark.parametrize("lab_dir", LABS, ids=[p.name for p in LABS])
def test_lab_reference_gives_the_same_outputs_on_the_gpus_as_on_the_cpu(lab_dir):
    lab = load_lab(lab_dir)
    by_world: dict[int, list] = {}
    for check in lab.checks:
        for case in check.cases:
            by_world.setdefault(case["world_size"], []).append((check.call, dict(case)))
    sizes = sorted(p for p in by_world if p >= 2)
    if not sizes:
        pytest.skip(f"{lab_dir.name}: no multi-rank case")
    own = [p for p in sizes if p <= gpu_count()]  # NCCL, a GPU per rank
    runnable = own or sizes[:1]  # else the ranks share the GPUs: the smallest size
    args = (str(lab_dir), lab.info.student_files[0])
    for p in runnable:
        gpu = spawn(lab_calls, p, *args, by_world[p], device="cuda", timeout=600, echo=False)
        cpu = spawn(lab_calls, p, *args, by_world[p], device="cpu", timeout=600, echo=False)
        for rank in range(p):
            assert gpu[rank]["device"].startswith("cuda") and cpu[rank]["device"] == "cpu"
            _same(gpu[rank]["outputs"], cpu[rank]["outputs"],
                  f"{lab_dir.name}, p={p}, rank {rank}")


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_lesson_runs_top_to_bottom_on_the_gpus(path, monkeypatch):
    pytest.importorskip("nbclient")
    import nbformat

    monkeypatch.setenv("TOOLKIT_DEVICE", "cuda")  # the kernel inherits it: every launch on GPUs
    nb = nbformat.read(path, as_version=4)
    execute(nb, path.parent, timeout=900)
    text = "".join(str(o.get("text", "")) + str(o.get("data", {}).get("text/plain", ""))
                   for c in nb.cells for o in c.get("outputs", []))
    assert "Traceback" not in text
    if path.name.startswith("00_"):
        backend = "nccl" if gpu_count() >= LESSON_RANKS else "gloo"
        assert backend in text and "cuda:0" in text  # who_am_i: the backend and device
