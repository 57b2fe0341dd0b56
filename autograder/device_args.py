"""The devices a command's arguments give its grades: ``--device`` and ``--gpus-per-grade`` of
`grade`, `batch` and `batch --slurm`, checked against the lab, with the rules of
`autograder.devices` (which this applies to an argparse namespace; `autograder.cli` calls it).

`args.gpus` is the list of GPU ids this process may hand out, counted by `visible` before
`cli.main` hides them; nothing here starts a process or touches a GPU.
"""

from __future__ import annotations

from .devices import gpu_sets, resolve_device, visible_gpus
from .grade import max_ranks

_NOT_CPU = "--gpus-per-grade gives each grade GPUs: add --device cuda (or auto)"


def visible() -> list[int]:
    """The GPU ids this process may hand out; none when CUDA_VISIBLE_DEVICES cannot be read
    (--device cuda then says so)."""
    try:
        return visible_gpus()
    except ValueError:
        return []


def _lab_takes(device: str, args, lab) -> str:
    """`device` once the lab has had its say: a lab that runs on CPU only is graded on CPU
    under ``--device auto``, and refused under an explicit ``--device cuda``."""
    if device == "cuda" and "cuda" not in lab.info.devices:
        if args.device == "cuda":
            raise ValueError(f"{lab.info.slug} runs on {', '.join(lab.info.devices)} only: "
                             "grade it with --device cpu")
        return "cpu"
    return device


def for_grade(args, lab) -> tuple[str, list[int]]:
    """(device, the grade's GPUs) for `grade`: all the GPUs it was given, up to one per rank
    of its largest launch."""
    gpus, ranks = args.gpus or [], max_ranks(lab)
    device = _lab_takes(resolve_device(args.device, gpus=len(gpus), ranks=ranks), args, lab)
    return device, gpus[:ranks] if device == "cuda" else []


def for_batch(args, lab) -> tuple[str, list[list[int]]]:
    """(device, one GPU set per grade that may run at once) for `batch`."""
    gpus, ranks = args.gpus or [], max_ranks(lab)
    per_grade = args.gpus_per_grade or ranks
    if not args.gpus_per_grade and args.device == "cuda" and 0 < len(gpus) < ranks:
        per_grade = len(gpus)  # every GPU there is, shared by each grade's ranks
    if args.gpus_per_grade and args.device == "cpu":
        raise ValueError(_NOT_CPU)
    device = _lab_takes(resolve_device(args.device, gpus=min(len(gpus), per_grade), ranks=ranks),
                        args, lab)
    if device == "cpu":
        return "cpu", []
    return "cuda", gpu_sets(gpus, per_grade=per_grade, jobs=args.jobs)


def for_slurm(args, lab) -> dict:
    """--device / --gpus-per-grade for the job array: checked here against the lab (this login
    node need not have GPUs); each compute node resolves its own GPUs."""
    if args.device == "cpu":
        if args.gpus_per_grade:
            raise ValueError(_NOT_CPU)
        return {"device": "cpu"}
    if _lab_takes("cuda", args, lab) == "cpu":
        return {"device": "cpu"}
    per_grade = args.gpus_per_grade or max_ranks(lab)  # fewer: the ranks share them
    return {"device": args.device, "gpus_per_grade": per_grade}


__all__ = ["for_batch", "for_grade", "for_slurm", "visible"]
