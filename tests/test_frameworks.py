"""PyTorch Lightning on 2 CPU ranks against the course's own DDP and FSDP (toolkit.frameworks,
toolkit.experiments.frameworks): same losses and parameters where model, data order and
averaging are the same, different where the sampler differs; what the recorder sees of each
(Lightning's own Python calls and FSDP2's collectives, not torch DDP's C++ reducer, whose bytes
the kernel's write counter shows); the recorder installed in processes Lightning forks itself,
and Lightning joining ranks the course started.
"""

from __future__ import annotations

import importlib
from collections import Counter

import pytest

pytest.importorskip("pytorch_lightning",
                    reason="pytorch-lightning is not installed (a dependency in pyproject.toml: "
                           "`make setup` installs it)")

from toolkit.data_parallel.sampler import shard_indices  # noqa: E402
from toolkit.experiments.frameworks import (  # noqa: E402
    RUNS, RunResult, TrainConfig, compare, fit_launched, traffic_table)
from toolkit.frameworks import (  # noqa: E402
    RESPONSIBILITIES, CourseModule, RecorderCallback, read_recorded)
from toolkit.models import TinyGPT, count_parameters  # noqa: E402

pytestmark = pytest.mark.multirank
CONFIG = TrainConfig()                        # TinyGPT, 64 samples, 8 per rank, 2 epochs
STEPS = CONFIG.epochs * CONFIG.samples // (2 * CONFIG.batch_size)   # per rank, 2 ranks
GRAD_BYTES = 4 * count_parameters(TinyGPT(CONFIG.gpt))              # fp32, tied weight once
TOL = 1e-6


def ops(result: RunResult, rank: int = 0) -> Counter:
    return Counter(e.op for e in result.events if e.rank == rank)


def op_bytes(result: RunResult, op: str, rank: int = 0) -> int:
    return sum(e.nbytes for e in result.events if e.rank == rank and e.op == op)


@pytest.fixture(scope="module")
def runs() -> dict[str, RunResult]:
    """Every run: the forked ones one after another, the rest in one launch of 2 ranks."""
    return compare(RUNS, config=CONFIG, timeout=180)


def test_lightning_ddp_equals_the_course_ddp_with_lightnings_sampler(runs):
    lit, course = runs["lightning_ddp"], runs["course_ddp"]
    assert [len(r) for r in lit.losses] == [STEPS, STEPS]
    assert lit.seen == course.seen                 # the same samples, step by step, per rank
    assert lit.max_loss_diff(course) <= TOL
    assert lit.max_param_diff(course) <= TOL
    for res in (lit, course):                      # the replicas stayed equal
        for name, value in res.params[0].items():
            assert (value - res.params[1][name]).abs().max().item() <= TOL
    # What Lightning dealt is DistributedSampler(shuffle=True, seed=0) with set_epoch per epoch.
    per_epoch = STEPS // CONFIG.epochs
    for rank in range(2):
        for epoch in range(CONFIG.epochs):
            got = [i for batch in lit.seen[rank][epoch * per_epoch:(epoch + 1) * per_epoch]
                   for i in batch]
            assert got == shard_indices(CONFIG.samples, rank=rank, world_size=2, epoch=epoch)


def test_the_contiguous_split_of_lesson_04_trains_on_other_batches(runs):
    lit, split = runs["lightning_ddp"], runs["course_ddp_split"]
    assert split.seen[0][0] == list(range(CONFIG.batch_size))
    assert lit.max_loss_diff(split) > 1e-3 and lit.max_param_diff(split) > 1e-3


def test_the_recorder_sees_lightnings_calls_and_the_kernel_sees_ddps_reducer(runs):
    lit, course = runs["lightning_ddp"], runs["course_ddp"]
    for rank in range(2):
        # Lightning's own Python calls, from the callback's setup on: a flag broadcast before
        # every step (SIGTERM), barriers, and one all-reduce per length check of the training
        # DataLoader; no gradient all-reduce.
        sigterm = [e for e in lit.events if e.rank == rank and e.op == "broadcast"
                   and e.nbytes == 8 and e.shape == (1,)]
        assert len(sigterm) == STEPS
        assert all(e.nbytes < GRAD_BYTES for e in lit.events if e.rank == rank)
        assert op_bytes(lit, "all_reduce", rank) <= 64
        # The course's DDP, recorded: the broadcast of every parameter, one all-reduce of all
        # gradients (one bucket) per step.
        assert ops(course, rank)["all_reduce"] == STEPS
        assert op_bytes(course, "all_reduce", rank) == STEPS * GRAD_BYTES
        assert op_bytes(course, "broadcast", rank) == GRAD_BYTES
    # The kernel's count: on 2 ranks an all-reduce sends n bytes per rank, so both runs wrote
    # at least a step's gradients per step; they agree within 2 % (headers, Lightning's calls).
    for rank in range(2):
        assert lit.written[rank] >= STEPS * GRAD_BYTES
        assert abs(lit.written[rank] - course.written[rank]) <= 0.02 * course.written[rank]
    assert lit.written[0] >= (STEPS + 1) * GRAD_BYTES  # + rank 0's broadcast of the model


def test_in_ranks_spawn_started_lightning_launches_nothing_and_trains_the_same(runs):
    """Outside a notebook, ``strategy="ddp"`` joins ranks that have LOCAL_RANK set; the recorder
    spawn installed sees everything the callback saw, and what came before its setup hook."""
    forked, joined = runs["lightning_ddp"], runs["lightning_ddp_ranks"]
    assert joined.losses == forked.losses and joined.seen == forked.seen
    assert joined.max_param_diff(forked) <= TOL
    for rank in range(2):
        assert ops(joined, rank) - ops(forked, rank)      # more: calls before the setup hook
        assert not ops(forked, rank) - ops(joined, rank)  # all the callback saw, joined saw
        assert abs(joined.written[rank] - forked.written[rank]) <= 0.01 * forked.written[rank]


def test_sync_dist_logging_all_reduces_once_per_step_and_rank_0_writes_the_checkpoint(
        runs):
    base, logged, ckpt = (runs[k] for k in ("lightning_ddp", "lightning_ddp_log",
                                                "lightning_ddp_ckpt"))
    for rank in range(2):
        extra = [e for e in logged.events if e.rank == rank and e.op == "all_reduce"]
        assert len(extra) - ops(base, rank)["all_reduce"] == STEPS
        assert ops(ckpt, rank)["barrier"] > ops(base, rank)["barrier"]
    assert logged.max_param_diff(base) <= TOL and ckpt.max_param_diff(base) <= TOL
    assert len(ckpt.files) == 1 and ckpt.files[0].endswith(".ckpt")
    assert base.files == [] and logged.files == []


def test_lightning_fsdp2_equals_the_course_fsdp_and_records_the_same_collectives(runs):
    lit, course = runs["lightning_fsdp"], runs["course_fsdp"]
    assert lit.seen == course.seen
    assert lit.max_loss_diff(course) <= TOL and lit.max_param_diff(course) <= TOL
    for rank in range(2):
        # TinyGPT: 2 blocks gathered twice per step, the root once; one reduce-scatter each.
        assert ops(lit, rank)["all_gather_single"] == ops(course, rank)[
            "all_gather_into_tensor"] == 5 * STEPS
        assert ops(lit, rank)["reduce_scatter_single"] == ops(course, rank)[
            "reduce_scatter_tensor"] == 3 * STEPS
        # Even sizes at 2 ranks: no padding, so the same bytes: a shard in, the gradient in.
        assert op_bytes(lit, "all_gather_single", rank) == op_bytes(
            course, "all_gather_into_tensor", rank)
        assert op_bytes(lit, "reduce_scatter_single", rank) == op_bytes(
            course, "reduce_scatter_tensor", rank) == STEPS * GRAD_BYTES


def test_model_parallel_strategys_defaults_do_no_data_parallelism_on_one_node(runs):
    auto = runs["lightning_fsdp_auto"]
    assert ops(auto)["all_gather_single"] == 0 and ops(auto)["reduce_scatter_single"] == 0
    per_epoch = 2 * STEPS // CONFIG.epochs          # the whole data set on each rank
    for rank in range(2):
        first = sorted(i for batch in auto.seen[rank][:per_epoch] for i in batch)
        assert first == list(range(CONFIG.samples))
    assert auto.seen[0] == auto.seen[1]              # both ranks trained on the same batches


def test_traffic_table_counts_per_op(runs):
    table = traffic_table(runs)
    assert table.loc["course_ddp", "all_reduce calls"] == STEPS
    assert table.loc["lightning_ddp", "all_reduce calls"] == ops(runs["lightning_ddp"])[
        "all_reduce"]
    assert table.loc["course_ddp", "recorded bytes"] == (STEPS + 1) * GRAD_BYTES


def test_forked_ranks_record_through_the_callback_and_keep_their_replicas_equal(runs):
    forked = runs["lightning_ddp"]
    assert len(forked.params) == 2 and [len(r) for r in forked.losses] == [STEPS, STEPS]
    for name, value in forked.params[0].items():
        assert (value - forked.params[1][name]).abs().max().item() <= TOL
    for rank in range(2):
        assert forked.written[rank] >= STEPS * GRAD_BYTES


def test_notebook_kernels_forks_inherit_lightnings_interactive_flag(monkeypatch):
    """A kernel sets sys.ps1; Lightning reads it once at import, so ranks forked from a kernel
    refuse ``strategy="ddp"`` even with LOCAL_RANK set. Emulated with the flag itself."""
    import pytorch_lightning.trainer.connectors.accelerator_connector as connector

    monkeypatch.setattr(connector, "_IS_INTERACTIVE", True)
    with pytest.raises(Exception, match="not compatible with an interactive environment"):
        compare(["lightning_ddp_ranks"], config=CONFIG, timeout=120)


def test_read_recorded_names_the_missing_ranks(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"ranks \[0, 1\].*RecorderCallback"):
        read_recorded(tmp_path, 2)


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="lr"):
        CourseModule(TinyGPT(), lr=0)
    with pytest.raises(TypeError, match="nn.Module"):
        CourseModule("gpt", lr=0.1)
    with pytest.raises(ValueError, match="model"):
        TrainConfig(model="cnn")
    with pytest.raises(ValueError, match="batch_size"):
        TrainConfig(batch_size=0)
    with pytest.raises(ValueError, match="unknown runs"):
        compare(["lightning_tpu"])
    with pytest.raises(ValueError, match="strategy must be one of"):
        fit_launched("ddp")
    with pytest.raises(ValueError, match="threads"):
        RecorderCallback("x", threads=0)


def test_every_responsibility_names_importable_course_code():
    jobs = [r.job for r in RESPONSIBILITIES]
    assert {"process launch", "sampler", "gradient sync", "checkpointing", "precision",
            "logging"} <= set(jobs)
    for row in RESPONSIBILITIES:
        for dotted in row.course_names:
            module, _, name = dotted.rpartition(".")
            assert hasattr(importlib.import_module(module), name), dotted
