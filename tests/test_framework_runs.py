"""DeepSpeed and Hugging Face Accelerate on 2 CPU gloo ranks against the course's ZeRO stages and
DDP (toolkit.experiments.framework_runs): equal weights at every ZeRO stage with gradient
accumulation, the traffic DeepSpeed's stages put on the wire as the recorder sees it, DeepSpeed's
default gradient clipping reproduced by the course's run with clip_grad_norm_, and Accelerate's
FSDP plugin falling back to DDP on CPU.
"""

from __future__ import annotations

from collections import Counter

import pytest

pytest.importorskip("deepspeed", reason="deepspeed is not installed (a dependency in "
                                        "pyproject.toml: `make setup` installs it)")
pytest.importorskip("accelerate", reason="accelerate is not installed (a dependency in "
                                         "pyproject.toml: `make setup` installs it)")

from toolkit.experiments.framework_runs import (  # noqa: E402
    RUNS, STAGES, AccumConfig, RankRun, compare_zero)
from toolkit.experiments.frameworks import wire_bytes  # noqa: E402
from toolkit.experiments.train_config import TrainConfig  # noqa: E402
from toolkit.models import TinyGPT, count_parameters  # noqa: E402

pytestmark = [pytest.mark.multirank, pytest.mark.slow]
CONFIG = AccumConfig()                       # TinyGPT, 8 samples per rank per step as 2 x 4
STEPS = CONFIG.train.epochs * CONFIG.train.samples // (2 * CONFIG.train.batch_size)
ALLREDUCE = 4 * count_parameters(TinyGPT(CONFIG.train.gpt))   # ring all-reduce at 2 ranks: n
TOL = 1e-6


@pytest.fixture(scope="module")
def runs() -> dict[str, RankRun]:
    return compare_zero(RUNS, config=CONFIG, world_size=2, timeout=240)


def per_step_ratio(run: RankRun) -> float:
    """Rank 0's wire bytes per step of calls carrying more than a scalar, the initial broadcast
    left out, over one ring all-reduce of the fp32 gradient."""
    carried = [e for e in run.events
               if e.rank == 0 and e.op not in ("broadcast", "barrier") and e.nbytes > 8]
    return wire_bytes(carried, rank=0, world_size=2) / STEPS / ALLREDUCE


@pytest.mark.parametrize("stage", STAGES)
def test_deepspeed_takes_the_course_steps_at_every_zero_stage(runs, stage):
    ds, ours = runs[f"deepspeed_zero{stage}"], runs[f"course_zero{stage}"]
    assert [len(r) for r in ds.losses] == [STEPS, STEPS] == [len(r) for r in ours.losses]
    assert ds.info[0]["zero_stage"] == stage and ds.info[0]["gradient_accumulation_steps"] == 2
    assert ds.max_param_diff(ours) <= TOL
    # Both ranks end with the same full parameters (stage 3's gathered).
    assert all((ds.params[0][k] - ds.params[1][k]).abs().max() <= TOL for k in ds.params[0])


def test_the_recorder_sees_deepspeeds_gradient_traffic(runs):
    # Stage 0 and the course's stages 0-2: one all-reduce's worth per step, the ZeRO paper's 2Ψ.
    for name in ("deepspeed_zero0", "course_zero0", "course_zero1", "course_zero2"):
        assert per_step_ratio(runs[name]) == pytest.approx(1.0, rel=0.01), name
    # DeepSpeed 0.19 on gloo: stage 1 all-reduces then all-gathers (1.5x); stage 2 all-reduces
    # every micro-batch (k = 2) and all-gathers once.
    assert per_step_ratio(runs["deepspeed_zero1"]) == pytest.approx(1.5, rel=0.01)
    assert per_step_ratio(runs["deepspeed_zero2"]) == pytest.approx(2.5, rel=0.01)
    big = Counter(e.op for e in runs["deepspeed_zero2"].events if e.rank == 0 and e.nbytes > 8
                  and e.op != "broadcast")
    assert big["all_reduce"] == 2 * STEPS and big["all_gather_into_tensor"] == STEPS


def test_deepspeeds_default_clipping_is_clip_grad_norm_at_one(runs):
    default, clipped, plain = (runs["deepspeed_default"], runs["course_clipped"],
                               runs["course_zero0"])
    assert default.max_param_diff(clipped) <= TOL
    assert default.max_param_diff(plain) > 1e-2     # the default changes the steps


def test_accelerate_is_ddp_on_cpu_and_ignores_the_fsdp_plugin(runs):
    for name in ("accelerate_ddp", "accelerate_fsdp"):
        run = runs[name]
        assert run.info[0] == {"distributed_type": "MULTI_CPU",
                               "prepared": "DistributedDataParallel"}
        assert run.max_param_diff(runs["course_zero0"]) <= TOL
        assert run.events == []     # torch DDP reduces from C++: nothing recorded


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="micro_batches=3 must divide"):
        AccumConfig(train=TrainConfig(batch_size=8), micro_batches=3)
    with pytest.raises(ValueError, match="unknown runs"):
        compare_zero(["deepspeed_zero9"])
