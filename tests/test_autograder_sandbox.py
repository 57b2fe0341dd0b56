"""Issue 19's attacks on the grader and its sandbox, each a fault of lab 01's corpus
(tests/faults/01_collectives/) with the invariant that must hold: no full marks for the cheats,
no file text leaked, no hang, nothing written outside the grade that outlives it, no grader
failure, escapes neutralised, a limit costs only its own check (in every lab).
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
import threading

import pytest
from faultkit import (LIMITS, ROOT, assert_failed, assert_passed, report_text, run_fault,
                      run_grade, source)

from autograder.lab import Lab, find_lab, load_lab

# fault → (checks it runs, checks that fail with their kind, regexes the first failure matches)
SANDBOX_FAULTS = {
    "hidden_builtin": None,      # in test_autograder_faults.CASES
    "rebuild_inputs": (["ar", "ring", "tree"], {"ar": "wrong_result", "ring": "wrong_result"},
                       [r"wrong on ranks? "]),
    "abstract_socket": (["ar", "tree"], {"ar": "sandbox_violation"},
                        [r"Operation not permitted", r"sockets"]),
    "loopback_tcp": None,        # its own test: a listener must see nothing
    "dev_shm": None,             # its own test: /dev/shm must hold nothing new
    "device_nodes": (["ar", "tree"], {"ar": "sandbox_violation"},
                     [r"Read-only file system: '/dev/console'"]),
    "links_and_fifos": None,     # its own test: no line of the targets in the report
    "empty_folders": (["ar", "tree"], {"ar": "disk_limit"}, [r"10,000 files and folders"]),
    "nested_folders": (["ar", "tree"], {}, []),
    "forged_frame": (["ar", "tree"], {"ar": "tampering"}, [r"does not accept|no frame"]),
    "escape_sequences": None,    # its own test
    "covert_channels": (["ar"], {"ar": "exception"}, [r"channels open: \[\]"]),
}


@pytest.fixture(scope="module")
def lab01() -> Lab:
    return load_lab(find_lab("01_collectives"), hidden=False)


@pytest.mark.parametrize("fault", sorted(f for f, spec in SANDBOX_FAULTS.items() if spec))
def test_attack_is_closed(lab01, fault, tmp_path):
    names, failing, says = SANDBOX_FAULTS[fault]
    result, by_name = run_fault(lab01, fault, names, tmp_path)
    for name in names:
        if name in failing:
            assert_failed(by_name[name], failing[name])
        else:
            assert_passed(by_name[name])
    if failing:
        first = next(n for n in names if n in failing)
        assert_failed(by_name[first], failing[first], *says)


def test_covert_channels_are_each_refused(lab01, tmp_path):
    result, by_name = run_fault(lab01, "covert_channels", ["ar"], tmp_path)
    refused = re.search(r"refused: \[([^\]]*)\]", by_name["ar"].message).group(1)
    for name in ("keyring", "flock", "fcntl lock", "directory notice", "inotify", "sysv shm",
                 "sysv msg", "posix mq", "user namespace", "peer memory", "peer name",
                 "peer command line", "cgroup task count", "host memory", "kill fork server"):
        assert f"'{name}'" in refused, (name, by_name["ar"].message)


def test_loopback_services_are_out_of_reach(lab01, tmp_path):
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    accepted: list = []

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except (socket.timeout, OSError):
                pass

    stop = threading.Event()
    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    text = source("loopback_tcp").replace("LISTENER_PORT = 0", f"LISTENER_PORT = {port}")
    try:
        result, by_name = run_fault(lab01, "loopback_tcp", ["ar", "tree"], tmp_path, text=text)
    finally:
        stop.set()
        thread.join()
        listener.close()
    assert accepted == []
    assert_failed(by_name["ar"], "sandbox_violation", r"Operation not permitted")
    assert_passed(by_name["tree"])


def test_nothing_lands_in_dev_shm(lab01, tmp_path):
    # Only the fault's own names: other processes of the machine (Chromium, another pytest-xdist
    # worker's ranks) may make and remove files in /dev/shm meanwhile.
    result, by_name = run_fault(lab01, "dev_shm", ["ar", "tree"], tmp_path)
    assert [n for n in os.listdir("/dev/shm") if n.startswith("grade-leftover-")] == []
    assert_failed(by_name["ar"], "sandbox_violation", r"No such file or directory: '/dev/shm/")
    assert_passed(by_name["tree"])


def test_links_and_fifos_are_neither_followed_nor_opened(lab01, tmp_path):
    result, by_name = run_fault(lab01, "links_and_fifos", ["ar", "tree"], tmp_path)
    assert_failed(by_name["ar"], "sandbox_violation", r"Permission denied")
    assert_passed(by_name["tree"])
    text = report_text(result)
    hidden = (ROOT / "labs" / "01_collectives" / "hidden" / "checks.py").read_text()
    leaked = [line for line in hidden.splitlines() if len(line.strip()) > 20 and line in text]
    assert leaked == []
    assert "root:" not in text  # /etc/shadow's first line


def test_escape_sequences_never_reach_the_report(lab01, tmp_path):
    result, by_name = run_fault(lab01, "escape_sequences", ["ar", "tree"], tmp_path)
    assert_failed(by_name["ar"], "exception", r"RuntimeError: bad \\x1b\[2J\\x1b\]0;pwned")
    text = report_text(result)
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e]", text)
    assert "\\u202e" in by_name["ar"].message
    assert_passed(by_name["tree"])


def test_values_without_communication_get_no_points(lab01, tmp_path):
    """A rank sees only its own input and the case's public parameters: rebuilding the others'
    inputs from the harness (issue 19's cheat 2, first half) gets no points."""
    result, by_name = run_fault(lab01, "recompute_from_seed", ["ar"], tmp_path)
    assert by_name["ar"].score == 0


# A limit in one function costs only the checks that call it, in every lab: (checks of the lab's
# visible list by name prefix, the fault appended to the reference, which check must fail).
CREEP = '''
def _creep(*args, **kwargs):
    hoard = []
    while True:
        hoard.append(torch.ones(16 * 2**20))  # 64 MiB, touched
'''
PER_LAB = {
    "01_collectives": ("collectives.py", CREEP + "ring_all_gather = _creep\n",
                       ["ring_all_gather", "tree_broadcast: every"]),
    "02_ddp": ("ddp.py", CREEP + "DDP.no_sync = _creep\n", ["no_sync", "assign_buckets"]),
    "03_sharded_optimizer": ("sharding.py", CREEP + "ShardedOptimizer.step = _creep\n",
                             ["ShardedOptimizer (SGD", "shard_bounds"]),
    "04_pipeline_schedule": ("schedules.py",
                             "import torch\n" + CREEP + "bubble_fraction = _creep\n",
                             ["bubble_fraction", "gpipe"]),
    "05_tensor_parallel_mlp": ("tp_mlp.py", CREEP + "RowParallelLinear.forward = _creep\n",
                               ["RowParallelLinear", "ColumnParallelLinear"]),
    "06_mixed_precision": ("mixed_precision.py", CREEP + "all_reduce_gradients = _creep\n",
                           ["all_reduce_gradients", "master_copy"]),
    "07_expert_parallel": ("moe_exchange.py", CREEP + "keep = _creep\n",
                           ["keep", "expert_capacity"]),
}


@pytest.mark.multirank
@pytest.mark.parametrize("name", sorted(PER_LAB))
def test_a_limit_costs_only_its_check_in_every_lab(name, tmp_path):
    student, fault, (bombed, clean) = PER_LAB[name]
    lab = load_lab(ROOT / "labs" / name, hidden=False)
    pick = [next(c for c in lab.checks if c.name.startswith(prefix)) for prefix in (bombed, clean)]
    pick = [dataclasses.replace(c, cases=c.cases[:1], timeout=60.0) for c in pick]
    small = dataclasses.replace(lab, checks=pick)
    path = tmp_path / "subs" / student
    path.parent.mkdir(parents=True)
    path.write_text((lab.path / student).read_text() + "\n" + fault)
    limits = dataclasses.replace(LIMITS, total_memory_mb=1500)
    result, _ = run_grade(small, path, tmp_path, limits=limits)
    assert_failed(result.checks[0], "memory_limit")
    assert_passed(result.checks[1])
