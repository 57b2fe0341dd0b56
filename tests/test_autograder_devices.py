"""Grading on GPUs, the parts that run here (issue 18): which device a grade gets, disjoint GPU
sets for concurrent grades, the environment a grade and its ranks would get, what a CUDA rank
may open, and a clear error, before anything starts, when --device cuda meets a machine without
GPUs. Grading labs on real GPUs is tests/test_gpu_grading.py (skipped without GPUs)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from autograder.batch import grade_command
from autograder.cli import main as cli
from autograder.devices import (
    gpu_sets,
    grade_env,
    rank_device,
    resolve_device,
    shared_note,
    visible_gpus,
)
from autograder.grade import grade, max_ranks
from autograder.lab import load_lab
from autograder.sandbox.channel import pack, unpack
from autograder.sandbox import confine, landlock, limits, zygote
from autograder.sandbox.confine import rank_env
from autograder.sandbox.limits import Limits
from autograder.sandbox.paths import rank_paths
from toolkit.launch import gpu_count

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "labs" / "01_collectives" / "collectives.py"


def test_visible_gpus_follow_cuda_visible_devices():
    assert visible_gpus({}, count=4) == [0, 1, 2, 3]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "4,5,6,7"}, count=4) == [4, 5, 6, 7]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, count=4) == []
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "0,1"}, count=0) == []  # a CPU build
    with pytest.raises(ValueError, match="CUDA_VISIBLE_DEVICES must list GPU numbers"):
        visible_gpus({"CUDA_VISIBLE_DEVICES": "GPU-5f3e"}, count=1)


def test_the_device_is_resolved_from_the_gpus_and_the_lab_s_ranks():
    assert resolve_device("cpu", gpus=8, ranks=4) == "cpu"
    assert resolve_device("auto", gpus=0, ranks=4) == "cpu"
    assert resolve_device("auto", gpus=3, ranks=4) == "cpu"
    assert resolve_device("auto", gpus=4, ranks=4) == "cuda"
    assert resolve_device("cuda", gpus=4, ranks=4) == "cuda"
    with pytest.raises(ValueError, match=r"no CUDA GPU is visible.*--device cpu"):
        resolve_device("cuda", gpus=0, ranks=4)
    assert resolve_device("cuda", gpus=2, ranks=4) == "cuda"  # the ranks share 2 GPUs
    assert resolve_device("cuda", gpus=1, ranks=4) == "cuda"
    with pytest.raises(ValueError, match="--device must be one of cpu, cuda, auto"):
        resolve_device("tpu", gpus=0, ranks=1)


def test_concurrent_grades_get_disjoint_gpu_sets_and_never_more_grades_than_sets():
    eight = list(range(8))
    assert gpu_sets(eight, per_grade=4, jobs=3) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert gpu_sets(eight, per_grade=2, jobs=2) == [[0, 1], [2, 3]]
    sets = gpu_sets([3, 5, 6, 7, 9], per_grade=2, jobs=8)
    assert sets == [[3, 5], [6, 7]]
    flat = [g for s in sets for g in s]
    assert len(flat) == len(set(flat))
    with pytest.raises(ValueError, match="only 2 GPU"):
        gpu_sets([0, 1], per_grade=4, jobs=1)
    with pytest.raises(ValueError, match="--gpus-per-grade must be an int >= 1"):
        gpu_sets(eight, per_grade=0, jobs=1)


def test_the_environment_of_a_grade_and_of_its_ranks():
    assert grade_env("cpu") == {"CUDA_VISIBLE_DEVICES": "", "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}
    assert grade_env("cuda", [4, 5, 6, 7]) == {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    with pytest.raises(ValueError, match="needs its GPU set"):
        grade_env("cuda", [])
    assert [rank_device("cuda", r) for r in range(3)] == ["cuda:0", "cuda:1", "cuda:2"]
    assert [rank_device("cuda", r, 2) for r in range(4)] == ["cuda:0", "cuda:1"] * 2  # shared
    assert [rank_device("cuda", r, 1) for r in range(3)] == ["cuda:0"] * 3
    assert rank_device("cpu", 3) == "cpu"
    spec = {"home": "/tmp/h", "rank": 1, "world_size": 4, "gpus": "4,5,6,7"}
    assert rank_env({**spec, "device": "cuda:1"})["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    assert rank_env({**spec, "device": "cpu"})["CUDA_VISIBLE_DEVICES"] == ""
    assert rank_env({**spec, "device": "cuda:1"})["RANK"] == "1"
    cmd, env = grade_command(Path("s1"), Path("labs/02_ddp"), Path("r.json"), "cuda", [2, 3])
    assert cmd[-2:] == ["--device", "cuda"] and env["CUDA_VISIBLE_DEVICES"] == "2,3"


def test_shared_gpus_are_said_in_the_report_and_each_rank_gets_gpu_r_mod_g():
    assert shared_note(ranks=4, gpus=4) is None
    note = shared_note(ranks=4, gpus=1)
    assert "shared 1 GPU " in note and "cuda:(r mod 1)" in note and "not those" in note
    lab01 = load_lab(ROOT / "labs" / "01_collectives")
    with pytest.raises(ValueError, match=r"needs its GPUs \(1 to 4"):
        grade(lab01, REFERENCE, device="cuda", gpus=[])


def test_a_cuda_rank_may_open_the_gpu_nodes_only_on_a_cuda_grade(tmp_path, monkeypatch):
    cpu_read, cpu_write, _ = rank_paths(tmp_path, tmp_path / "home")
    gpu_read, gpu_write, _ = rank_paths(tmp_path, tmp_path / "home", gpu=True)
    assert cpu_write == gpu_write == [str(tmp_path / "home"), "/dev/null"]
    added = set(gpu_read) - set(cpu_read)
    assert all(p.startswith(("/proc/driver/nvidia", "/sys/")) for p in added)
    assert not any("nvidia" in p for p in cpu_read + cpu_write)
    # The nodes themselves get read, write and ioctl (Landlock ABI 5), on a cuda grade only.
    seen = {}

    def restrict(read, write, listing, **kw):
        seen.update(kw)
        return 5

    monkeypatch.setattr(confine.landlock, "abi_version", lambda: 5)
    monkeypatch.setattr(confine.landlock, "restrict", restrict)
    monkeypatch.setattr(confine, "gpu_nodes", lambda: ["/dev/nvidiactl", "/dev/nvidia0"])
    spec = {"code": str(tmp_path), "toolkit": ()}
    confine._landlock({**spec, "device": "cuda:0"}, tmp_path / "home")
    assert seen["devices"] == ["/dev/nvidiactl", "/dev/nvidia0"]
    confine._landlock({**spec, "device": "cpu"}, tmp_path / "home")
    assert tuple(seen["devices"]) == ()


def test_landlock_gives_device_rules_the_ioctl_right(monkeypatch):
    rules = []
    monkeypatch.setattr(landlock, "abi_version", lambda: 5)
    monkeypatch.setattr(landlock, "_add_rule", lambda libc, rs, path, rights: rules.append(
        (path, rights)))

    class Libc:  # create_ruleset answers a descriptor restrict may close; the rest succeed
        made = False

        def syscall(self, *args):
            if not self.made:
                self.made = True
                return os.open(os.devnull, os.O_RDONLY)
            return 0

        def prctl(self, *args):
            return 0

    monkeypatch.setattr(landlock, "_libc", Libc)
    landlock.restrict(["/usr"], ["/tmp/h"], devices=["/dev/nvidia0"])
    rights = dict(rules)
    assert rights["/dev/nvidia0"] & landlock.IOCTL_DEV
    assert not rights["/tmp/h"] & landlock.IOCTL_DEV and not rights["/usr"] & landlock.IOCTL_DEV


def test_a_cuda_rank_has_no_address_space_cap(monkeypatch):
    """The CUDA driver reserves tens of GiB of addresses when it starts: RLIMIT_AS would fail
    it, so a cuda grade's ranks are bounded by the watchdog's resident sum instead."""
    set_to = {}
    monkeypatch.setattr(limits.resource, "setrlimit", lambda which, v: set_to.update({which: v}))
    limits.apply_rlimits(Limits(), 12345, address_space=False)
    assert limits.resource.RLIMIT_AS not in set_to and limits.resource.RLIMIT_NPROC in set_to
    monkeypatch.setattr(limits, "address_space_now", lambda: 5 << 30)  # a CUDA torch's libraries
    limits.apply_rlimits(Limits(), 12345)
    assert set_to[limits.resource.RLIMIT_AS][0] == (5 << 30) + Limits().memory_mb * limits.MB


RESERVED_THEN_CAPPED = """
import mmap, resource, sys
from autograder.sandbox.limits import MB, Limits, address_space_now, apply_rlimits
# What a CUDA build of torch does at import on any machine, GPU or not: several GiB of
# libraries mapped before the rank runs a line (reserved here, as 3 GiB of PROT_NONE).
held = mmap.mmap(-1, 3 << 30, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, prot=0)  # PROT_NONE
before = address_space_now()
apply_rlimits(Limits(memory_mb=512), None)
cap = resource.getrlimit(resource.RLIMIT_AS)[0]
ok = bytearray(256 * MB)                     # the rank's own allocation, under its 512 MiB
try:
    bytearray(1024 * MB)                     # past it: refused
    print("over: allowed")
except MemoryError:
    print("over: MemoryError")
print(before >= 3 << 30, cap - before == 512 * MB, len(ok) == 256 * MB)
"""


def test_the_address_space_cap_counts_what_the_rank_maps_not_its_libraries():
    """A CPU grade on a GPU machine: the fork server's CUDA torch has mapped several GiB before a
    rank starts, and an absolute 2 GiB cap left no allocation possible in any rank. The cap is
    the rank's own budget on top of what it has mapped: 256 MiB fits, 1 GiB past 512 does not."""
    done = subprocess.run([sys.executable, "-c", RESERVED_THEN_CAPPED], capture_output=True,
                          text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:2] == ["over: MemoryError", "True True True"]


def test_the_fork_server_warms_autograd_only_with_the_gpus_hidden(monkeypatch):
    """autograd's first backward starts the CUDA driver where GPUs are visible; a cuda grade's
    fork server must not (its forked ranks' CUDA calls would fail)."""
    import torch
    calls = []
    monkeypatch.setattr(torch.Tensor, "backward", lambda self, *a, **k: calls.append(1))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    zygote._warm()
    assert calls == []
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    zygote._warm()
    assert calls == [1]
    assert confine.rank_env({"home": "/h", "rank": 0, "world_size": 2})[
        "PYTORCH_NVML_BASED_CUDA_CHECK"] == "1"


def test_tensors_are_encoded_as_cpu_copies_on_any_device():
    """What a rank sends back is bytes of a CPU copy (a meta tensor has none: refused)."""
    tree, data = pack({"y": torch.arange(6.0).reshape(2, 3)})
    back = unpack(tree, data)["y"]
    assert back.device.type == "cpu" and back.tolist() == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(NotImplementedError):
        pack(torch.empty(3, device="meta"))


def test_grade_refuses_a_device_the_lab_does_not_run_on(tmp_path):
    lab04 = load_lab(ROOT / "labs" / "04_pipeline_schedule")
    assert lab04.info.devices == ("cpu",)
    with pytest.raises(ValueError, match="runs on cpu only"):
        grade(lab04, tmp_path, device="cuda", gpus=[0, 1, 2, 3])
    assert max_ranks(load_lab(ROOT / "labs" / "01_collectives")) == 4


@pytest.mark.skipif(gpu_count() > 0, reason="a machine with GPUs")
def test_cuda_without_gpus_is_a_clear_error_before_anything_starts(tmp_path, capsys):
    json_out = tmp_path / "r.json"
    code = cli(["grade", str(REFERENCE), "--lab", "01_collectives", "--device", "cuda",
                "--json", str(json_out)])
    err = capsys.readouterr().err
    assert code == 2 and "no CUDA GPU is visible" in err and "--device cpu" in err
    assert not json_out.exists()  # refused before grading: nothing to report
    code = cli(["batch", str(tmp_path), "--lab", "01_collectives", "--device", "cuda",
                "--gpus-per-grade", "4", "--out", str(tmp_path / "out")])
    assert code == 2 and "no CUDA GPU is visible" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    code = cli(["batch", str(tmp_path), "--lab", "01_collectives", "--gpus-per-grade", "4"])
    assert code == 2 and "add --device cuda" in capsys.readouterr().err


def test_batch_and_slurm_allow_fewer_gpus_per_grade_than_ranks():
    from argparse import Namespace

    from autograder.device_args import for_batch, for_slurm

    lab01 = load_lab(ROOT / "labs" / "01_collectives")  # launches of up to 4 ranks

    def batch(gpus, per_grade=None, jobs=2, device="cuda"):
        return for_batch(Namespace(gpus=gpus, gpus_per_grade=per_grade, jobs=jobs,
                                        device=device), lab01)

    assert batch([0]) == ("cuda", [[0]])  # one GPU: every grade's ranks share it
    assert batch([0, 1], per_grade=1) == ("cuda", [[0], [1]])  # two grades at once
    assert batch(list(range(8))) == ("cuda", [[0, 1, 2, 3], [4, 5, 6, 7]])
    assert batch([0], device="auto") == ("cpu", [])  # auto: a GPU per rank, else CPU
    args = Namespace(device="cuda", gpus_per_grade=1)
    assert for_slurm(args, lab01) == {"device": "cuda", "gpus_per_grade": 1}
