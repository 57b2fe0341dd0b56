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

Past 1F1B (the time of one micro-batch through one stage: t_f forward, t_b input gradient, t_w
weight gradient; a backward that is not split takes t_b + t_w):

* ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, section 2.3, Table 2): idle
  time per stage (p − 1)(t_f + t_b − t_w) against 1F1B's (p − 1)(t_f + t_b + t_w), the same
  p micro-batches in flight on stage 0 (stage r: p − r whole, r waiting for their W).
* Chimera (Li & Hoefler, SC 2021, section 3.2, Table 2), p even: (p − 2)/2 backward-plus-forward
  times idle per rank, idle fraction (p − 2)/(2m + p − 2), counted as the paper does: forward
  and backward of equal length, m = p (one basic unit); activations from p/2 + 1 (ranks 0 and
  p − 1) to p micro-batches (the middle ranks); two stages' weights per rank.
* ZB-V (Qi et al., arXiv:2401.10241, the version that adds it; the authors' comparison table,
  t_F = t_B = t_W): two chunks per rank in a V, every backward split; bubble 0 counted from each
  stage's first op, activations 1× 1F1B's (p micro-batches on every stage), pipeline messages
  2×. In one step each stage still waits for the fill: the last one's first input arrives after
  p − 1 chunk forwards, (p − 1)·t_f/2 (what `bubble_time` returns; the toolkit's `zb_v` reaches
  it at equal times).
* DualPipe (DeepSeek-V3 technical report, section 3.2.1, Table 2), p even, m ≥ 2p micro-batches
  in both directions: bubble (p/2 − 1)(F&B + B − 3W) with F a chunk's forward, B its whole
  backward (t_b + t_w), W its weight part and F&B an overlapped forward-and-backward pair; with
  free messages overlap hides nothing, F&B = F + B, and the bubble is (p/2 − 1)(t_f + 2t_b −
  t_w); parameters 2× (two stages per rank, as Chimera); activations p + 1 micro-batches.
* TeraPipe (Li et al., ICML 2021, section 3.3): with n token slices taking t_1 … t_n (forward
  plus backward through one stage), one step takes Σ t_i + (p − 1)·max t_j; equal slices give
  GPipe's (p − 1)/(n + p − 1). Every slice is held until its backward (n per stage).

Each formula assumes what its paper assumes: equal stages and free messages, for ZB-H1
t_w ≤ t_f (else W cannot fill the drain; `toolkit.pipeline.simulate` shows by how much), for
ZB-V t_f = t_b = t_w, for DualPipe t_f ≤ t_b and t_w ≤ t_b with each F&B pair starting once
both its inputs are in (`simulate(..., pairs=True)`).
"""

from __future__ import annotations

from typing import Sequence

from ..arguments import check_int


def check_sizes(owner: str, p: int, m: int, v: int = 1) -> None:
    """Raise a ValueError naming `owner` unless p (stages), m (micro-batches) and v (chunks per
    rank) are ints >= 1: the sizes every schedule and formula here takes."""
    check_int(owner, "p", p, hint="the number of stages (ranks)")
    check_int(owner, "m", m, hint="the number of micro-batches")
    check_int(owner, "v", v, hint="the number of model chunks per rank")


_CLASSIC = ("naive", "gpipe", "1f1b", "interleaved", "terapipe")
_ALL = _CLASSIC + ("zbh1", "zbv", "chimera", "dualpipe")
_TIMED = ("zbh1", "zbv", "dualpipe")         # bubbles that depend on t_f, t_b, t_w


def _key(owner: str, schedule: str) -> str:
    key = str(schedule).lower().replace("-", "").replace("_", "")
    if key not in _ALL:
        raise ValueError(f"{owner}: unknown schedule {schedule!r}; choose naive, gpipe, 1f1b, "
                         f"interleaved, zb-h1, zb-v, chimera, dualpipe or terapipe")
    return key


def _even(owner: str, name: str, p: int, m: int | None = None) -> None:
    if p % 2 or (m is not None and (m % 2 or m < 2 * p)):
        more = "" if m is None else " and m (micro-batches, both directions) even and >= 2p"
        raise ValueError(f"{owner}: {name} needs an even p (stages){more}, got p = {p}"
                         + ("" if m is None else f", m = {m}"))


def _times(owner: str, forward: float, backward: float, weight: float) -> None:
    for name, t in (("forward", forward), ("backward", backward), ("weight", weight)):
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not t >= 0:
            raise ValueError(f"{owner}: {name} (time of one micro-batch through one stage) "
                             f"must be a number >= 0, got {t!r}")


def bubble_time(schedule: str, *, p: int, m: int = 1, v: int = 1, forward: float = 1.0,
                backward: float = 2.0, weight: float = 0.0) -> float:
    """Idle time per stage in one step, by the formula of the schedule's paper (see the module
    docstring): (p−1)(t_f + t_b + t_w)/v for naive (m = 1), GPipe, 1F1B, interleaved (v) and
    TeraPipe with equal slices; (p−1)(t_f + t_b − t_w) for ZB-H1; (p−2)(t_f + t_b + t_w)/2 for
    Chimera. `backward` is the input-gradient part and `weight` the weight-gradient part of
    a backward (leave `weight` 0 and `backward` the whole backward for unsplit schedules).
    ZB-V: (p−1)·t_F/2, the fill (0 counted from each stage's first op); DualPipe (p even):
    (p/2−1)(F&B + B − 3W) with B = t_B + t_W, W = t_W and F&B = t_F + B."""
    check_sizes("bubble_time", p, m, v)
    _times("bubble_time", forward, backward, weight)
    key = _key("bubble_time", schedule)
    if key != "interleaved":
        v = 1
    if key == "zbh1":
        return (p - 1) * (forward + backward - weight)
    if key == "zbv":
        return (p - 1) * forward / 2
    if key == "dualpipe":
        _even("bubble_time", "DualPipe", p)
        whole = backward + weight                    # DeepSeek's B: the whole backward
        return (p / 2 - 1) * ((forward + whole) + whole - 3 * weight)
    if key == "chimera":
        if p % 2:
            raise ValueError(f"bubble_time: Chimera needs an even p (stages), got p = {p}")
        return (p - 2) * (forward + backward + weight) / 2
    return (p - 1) * (forward + backward + weight) / v


def step_time(schedule: str, *, p: int, m: int = 1, v: int = 1, forward: float = 1.0,
              backward: float = 2.0, weight: float = 0.0) -> float:
    """Time of one step by the formula: each stage's work m(t_f + t_b + t_w) (naive: m = 1)
    plus `bubble_time`."""
    key = _key("step_time", schedule)
    m = 1 if key == "naive" else m
    return m * (forward + backward + weight) + bubble_time(
        schedule, p=p, m=m, v=v, forward=forward, backward=backward, weight=weight)


def bubble_fraction(schedule: str, *, p: int, m: int = 1, v: int = 1,
                    forward: float | None = None, backward: float | None = None,
                    weight: float | None = None) -> float:
    """The idle fraction of the total time that theory predicts for `schedule` (equal stages,
    free communication): (p−1)/(m+p−1) for naive (m = 1), GPipe, 1F1B and TeraPipe with equal
    slices; (p−1)/(v·m+p−1) for interleaved, which needs p to divide m (else a ValueError:
    `simulate` gives the truth); (p−2)/(2m+p−2) for Chimera (p even); for ZB-H1, ZB-V and
    DualPipe it depends on the op times, so pass `forward`, `backward` (input gradient) and
    `weight` (`bubble_time` over `step_time`)."""
    check_sizes("bubble_fraction", p, m, v)
    key = _key("bubble_fraction", schedule)
    if key in _TIMED:
        if None in (forward, backward, weight):
            raise ValueError(f"bubble_fraction: the bubble of {schedule!r} depends on the op "
                             f"times; pass forward=, backward= (input gradient, B) and weight= "
                             f"(W), e.g. 1, 1, 1")
        return bubble_time(schedule, p=p, m=m, forward=forward, backward=backward,
                           weight=weight) / step_time(schedule, p=p, m=m, forward=forward,
                                                      backward=backward, weight=weight)
    if key == "naive":
        m = 1
    elif key != "interleaved":
        v = 1
    elif v > 1 and m % p:
        # Groups of fewer than p micro-batches leave gaps the formula does not count.
        raise ValueError(f"bubble_fraction: the interleaved formula needs m to be a multiple "
                         f"of p (got m={m}, p={p}); use simulate() for this case")
    if key == "chimera":
        if p % 2 or m < p:
            raise ValueError(f"bubble_fraction: Chimera's count is for an even p (stages) and "
                             f"m >= p micro-batches, got p = {p}, m = {m}; use simulate()")
        return (p - 2) / (2 * m + p - 2)
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


def terapipe_time(times: Sequence[float], *, p: int) -> float:
    """One step of TeraPipe (Li et al. 2021, section 3.3): Σ t_i + (p − 1)·max t_j for token
    slices taking `times` through one stage (forward plus backward)."""
    check_int("terapipe_time", "p", p, hint="the number of stages (ranks)")
    times = [float(t) for t in times]
    if not times or any(not t >= 0 for t in times):
        raise ValueError(f"terapipe_time: times must be one time >= 0 per slice, got {times!r}")
    return sum(times) + (p - 1) * max(times)


def peak_activations(schedule: str, *, p: int, m: int, stage: int = 0, v: int = 1,
                     weight_share: float = 1.0) -> float:
    """Most micro-batches' activations `stage` holds at once, in units of one micro-batch's
    activations on that stage: GPipe and TeraPipe m, 1F1B min(p − stage, m), naive 1,
    interleaved min(2(p − stage − 1) + (v − 1)p + 1, v·m) / v; ZB-H1 (m ≥ p) p − stage whole
    micro-batches and `stage` between their B and their W, each counted `weight_share` (M_W/M_B
    in Qi et al., Table 1); Chimera (m = p) min(p − stage, m/2) + min(stage + 1, m/2) (its
    two pipelines' 1F1B on this rank); ZB-V (m ≥ 2p) p, 1F1B's stage 0 on every stage (2p
    half-stage chunk sets, a set past its B counting 1/2, as `zb_v` counts them); DualPipe
    (m ≥ 2p, p even) p + 1 (DeepSeek-V3, Table 2)."""
    check_sizes("peak_activations", p, m, v)
    if not 0 <= stage < p:
        raise ValueError(f"peak_activations: stage must be in 0 … {p - 1}, got {stage}")
    key = _key("peak_activations", schedule)
    if key == "naive":
        return 1
    if key in ("gpipe", "terapipe"):
        return m
    if key == "1f1b" or (key == "interleaved" and v == 1):
        return min(p - stage, m)
    if key == "interleaved":
        return min(2 * (p - stage - 1) + (v - 1) * p + 1, v * m) / v
    if key == "zbh1":
        if m < p:
            raise ValueError(f"peak_activations: the ZB-H1 count is for m >= p (got m={m}, "
                             f"p={p}); count a built schedule with toolkit.pipeline.peak_held")
        return (p - stage) + stage * weight_share
    if key in ("zbv", "dualpipe"):
        if m < 2 * p:
            raise ValueError(f"peak_activations: the {schedule} count is for m >= 2p (got "
                             f"m={m}, p={p}); count a built schedule with "
                             f"toolkit.pipeline.peak_held")
        if key == "zbv":
            return p
        _even("peak_activations", "DualPipe", p, m)
        return p + 1
    if p % 2 or m != p:
        raise ValueError(f"peak_activations: the Chimera count is for one basic unit, m = p "
                         f"even (got p={p}, m={m}); count a built schedule with "
                         f"toolkit.pipeline.in_flight")
    return min(p - stage, m // 2) + min(stage + 1, m // 2)


__all__ = ["bubble_fraction", "bubble_time", "bubble_time_ratio", "check_sizes",
           "peak_activations", "pipeline_time", "step_time", "terapipe_time"]
