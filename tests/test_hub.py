"""docs/jupyterhub.md against what can be checked here: nbgitpuller links (built and parsed
back) and the per-student memory limits against every lesson's measured peak."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from toolkit.hub import LessonResources, lesson_resources, memory_limit_mb, nbgitpuller_url

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "jupyterhub.md").read_text()
MAP = (ROOT / "lessons" / "README.md").read_text()
SERVER_MB = 200   # MiB: the doc's allowance for the JupyterLab server (69-83 MB measured idle)


def mib(size: str) -> float:
    """Kubernetes / tljh-config sizes: 2G, 1536M, 2Gi."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([MG])i?", size)
    assert m, f"unreadable size {size!r}"
    return float(m.group(1)) * (1024 if m.group(2) == "G" else 1)


def documented() -> dict[str, float]:
    yaml = re.search(r"memory:\s*\n\s*limit:\s*(\S+)\s*\n\s*guarantee:\s*(\S+)", DOC)
    tljh = re.search(r"tljh-config set limits\.memory (\S+)", DOC)
    assert yaml and tljh, "docs/jupyterhub.md lost its memory limits"
    return {"limit": mib(yaml.group(1)), "guarantee": mib(yaml.group(2)),
            "tljh": mib(tljh.group(1))}


def test_the_map_gives_every_mapped_lesson_a_measured_peak() -> None:
    rows = lesson_resources(MAP)
    mapped = re.findall(r"^\|\s*\d{2}\s*\|\s*\[`?(\S+?\.ipynb)", MAP, re.M)
    assert [r.notebook for r in rows] == mapped and len(rows) >= 1
    assert all((ROOT / "lessons" / r.notebook).exists() for r in rows)
    row = lesson_resources("| 07 | [`07_x.ipynb`](07_x.ipynb): x | y | 45 min | 9.6 s / 570 MB |")
    assert row == [LessonResources("07", "07_x.ipynb", 9.6, 570.0)]


def test_documented_limits_cover_every_measured_peak() -> None:
    peaks = [r.peak_mb for r in lesson_resources(MAP)]
    need = memory_limit_mb(peaks, server_mb=SERVER_MB)
    doc = documented()
    assert doc["limit"] >= need and doc["tljh"] >= need, (doc, need)
    over = [r for r in lesson_resources(MAP) if r.peak_mb + SERVER_MB > doc["guarantee"]]
    assert not over, f"one lesson at its peak no longer fits the guarantee: {over}"
    # The page's own figures are the ones the code derives from today's map.
    assert f"→ {need} MiB" in DOC and f"2 × {max(peaks):.0f} MiB" in DOC
    assert f"{min(peaks):.0f} MiB to {max(peaks):.0f} MiB" in DOC
    raw = (SERVER_MB + 2 * max(peaks)) * 1.25
    assert f"= {raw:.0f} MiB →" in DOC and f"server ({SERVER_MB + max(peaks):.0f} MiB)" in DOC


def test_memory_limit_arithmetic_and_its_errors() -> None:
    assert memory_limit_mb([300.0, 500.0], server_mb=100, kernels=2, headroom=1.0) == 1280
    assert memory_limit_mb([1000.0], server_mb=24, kernels=1, headroom=1.0, step_mb=1024) == 1024
    with pytest.raises(ValueError, match=r"peaks_mb=\[\]"):
        memory_limit_mb([], server_mb=100)
    with pytest.raises(ValueError, match=r"headroom=0.9"):
        memory_limit_mb([1.0], server_mb=1, headroom=0.9)
    with pytest.raises(ValueError, match=r"kernels=0"):
        memory_limit_mb([1.0], server_mb=1, kernels=0)


def test_nbgitpuller_link_round_trips_every_argument() -> None:
    url = nbgitpuller_url("https://hub.example.edu/course/", repo="https://github.com/o/dl-course.git",
                          branch="v2026.1", path="labs/01 collectives/play&ground.ipynb")
    parts = urlsplit(url)
    assert (parts.scheme, parts.netloc) == ("https", "hub.example.edu")
    assert parts.path == "/course/hub/user-redirect/git-pull"
    query = parse_qs(parts.query, strict_parsing=True)
    assert {k: v for k, (v,) in query.items()} == {
        "repo": "https://github.com/o/dl-course.git", "branch": "v2026.1",
        "targetpath": "dl-course",
        "urlpath": "lab/tree/dl-course/labs/01 collectives/play&ground.ipynb"}
    other = parse_qs(urlsplit(nbgitpuller_url("http://h", repo="https://g/o/r", target="c",
                                              app="tree")).query)
    assert other["targetpath"] == ["c"] and other["urlpath"] == ["tree/c/lessons/README.md"]


@pytest.mark.parametrize("kwargs, match", [
    ({"hub": "hub.example.edu"}, "hub="),
    ({"hub": "https://h/?x=1"}, "hub="),
    ({"repo": "git@github.com:o/r.git"}, "repo="),
    ({"branch": "my branch"}, "branch="),
    ({"path": "../../etc/passwd"}, "path="),
    ({"target": "/srv"}, "target="),
    ({"app": "notebook"}, "app="),
])
def test_nbgitpuller_link_refuses_what_would_not_work(kwargs: dict, match: str) -> None:
    args = {"hub": "https://h", "repo": "https://github.com/o/r"} | kwargs
    with pytest.raises(ValueError, match=match):
        nbgitpuller_url(args.pop("hub"), **args)


def test_the_documented_link_is_what_the_builder_gives() -> None:
    shown = re.search(r"^\s+(https://hub\.example\.edu/hub/user-redirect/git-pull\S+)$", DOC, re.M)
    assert shown, "docs/jupyterhub.md lost its example link"
    assert shown.group(1) == nbgitpuller_url("https://hub.example.edu",
                                             repo="https://github.com/OWNER/course-student",
                                             branch="main")
