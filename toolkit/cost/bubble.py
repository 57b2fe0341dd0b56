"""Bubble and memory math of pipeline schedules: pure functions, numbers in, numbers out.

A model, like the rest of `toolkit.cost`: the planner composes it with the α-β and memory models,
and `toolkit.pipeline` (schedules as data, the simulator, the executor) re-exports it, so lessons
write ``pipeline.bubble_fraction``. Here it imports no algorithm.

With p stages, m micro-batches, v chunks per rank, and every stage taking the same time per
micro-batch (t_f forward, t_b backward):

* GPipe (Huang et al., NeurIPS 2019) and 1F1B (Narayanan et al., ICML 2021): the pipeline takes
  (m + p − 1)(t_f + t_b), of which each stage computes m(t_f + t_b), so the idle ("bubble")
  fraction of the total time is (p − 1)/(m + p − 1). Naive model parallel is the case m = 1:
  (p − 1)/p.
* Interleaved 1F1B (Narayanan et al., SC 2021, section 2.2.2): a chunk op takes 1/v of a stage's
  time, so the fill and drain shrink v times: bubble time (p − 1)(t_f + t_b)/v against m(t_f+t_b)
  of work, idle fraction (p − 1)/(v·m + p − 1) (for m a multiple of p).

Activations held (per stage, in units of one micro-batch's activations on that stage): GPipe
holds all m before the first backward; 1F1B at most min(p − r, m) on stage r (p on stage 0);
interleaved, on stage r, min(2(p − r − 1) + (v − 1)p + 1, v·m) chunk-sized sets, i.e. that
number divided by v in stage units (Megatron's warm-up, plus the forward of the steady state).
"""

from __future__ import annotations

from ..arguments import check_int


def check_sizes(owner: str, p: int, m: int, v: int = 1) -> None:
    """Raise a ValueError naming `owner` unless p (stages), m (micro-batches) and v (chunks per
    rank) are ints >= 1: the sizes every schedule and formula here takes."""
    check_int(owner, "p", p, hint="the number of stages (ranks)")
    check_int(owner, "m", m, hint="the number of micro-batches")
    check_int(owner, "v", v, hint="the number of model chunks per rank")


def bubble_fraction(schedule: str, *, p: int, m: int = 1, v: int = 1) -> float:
    """The idle fraction of the total time that theory predicts for `schedule` (equal stages,
    free communication): (p−1)/(m+p−1) for naive (m = 1), GPipe and 1F1B; (p−1)/(v·m+p−1) for
    interleaved, which needs p to divide m (else a ValueError: `simulate` gives the truth)."""
    check_sizes("bubble_fraction", p, m, v)
    key = str(schedule).lower().replace("-", "").replace("_", "")
    if key == "naive":
        m = 1
    elif key in ("gpipe", "1f1b"):
        v = 1
    elif key != "interleaved":
        raise ValueError(f"bubble_fraction: unknown schedule {schedule!r}; choose naive, "
                         f"gpipe, 1f1b or interleaved")
    elif v > 1 and m % p:
        # Groups of fewer than p micro-batches leave gaps the formula does not count.
        raise ValueError(f"bubble_fraction: the interleaved formula needs m to be a multiple "
                         f"of p (got m={m}, p={p}); use simulate() for this case")
    return (p - 1) / (v * m + p - 1)


def bubble_time_ratio(*, p: int, m: int, v: int = 1) -> float:
    """Bubble time over ideal compute time, (p−1)/(v·m) (the form the Megatron-LM paper
    writes); the idle fraction is this over 1 + this."""
    check_sizes("bubble_time_ratio", p, m, v)
    return (p - 1) / (v * m)


def pipeline_time(*, p: int, m: int, forward: float, backward: float, v: int = 1) -> float:
    """Ideal time of one step (equal stages, free communication): (v·m + p − 1)(t_f + t_b)/v,
    with `forward` and `backward` the times of one micro-batch through one whole stage."""
    check_sizes("pipeline_time", p, m, v)
    return (v * m + p - 1) * (forward + backward) / v


def peak_activations(schedule: str, *, p: int, m: int, stage: int = 0, v: int = 1) -> float:
    """Most micro-batches' activations `stage` holds at once, in units of one micro-batch's
    activations on that stage: GPipe m, 1F1B min(p − stage, m), naive 1, interleaved
    min(2(p − stage − 1) + (v − 1)p + 1, v·m) / v."""
    check_sizes("peak_activations", p, m, v)
    if not 0 <= stage < p:
        raise ValueError(f"peak_activations: stage must be in 0 … {p - 1}, got {stage}")
    key = str(schedule).lower().replace("-", "").replace("_", "")
    if key == "naive":
        return 1
    if key == "gpipe":
        return m
    if key == "1f1b" or (key == "interleaved" and v == 1):
        return min(p - stage, m)
    if key == "interleaved":
        return min(2 * (p - stage - 1) + (v - 1) * p + 1, v * m) / v
    raise ValueError(f"peak_activations: unknown schedule {schedule!r}; choose naive, gpipe, "
                     f"1f1b or interleaved")


__all__ = ["bubble_fraction", "bubble_time_ratio", "check_sizes", "peak_activations",
           "pipeline_time"]
