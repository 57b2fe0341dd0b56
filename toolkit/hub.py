"""Running the course on a class's JupyterHub: nbgitpuller links and per-student resources.

nbgitpuller link (nbgitpuller docs, "Use nbgitpuller", and its handler's query arguments):
    {hub}/hub/user-redirect/git-pull?repo=R&branch=B&targetpath=T&urlpath=lab/tree/T/PATH
JupyterHub's `user-redirect` sends each student to their own server; nbgitpuller clones (or
merges into) ~/T and then opens `urlpath`. Every value is percent-encoded as one query argument.

Memory per student (docs/jupyterhub.md): the JupyterLab server, plus `kernels` lessons or
playgrounds open at once, each at the largest peak measured for a lesson (PSS of the kernel
and its ranks, benchmarks/lesson_resources.py, recorded in lessons/README.md), times a headroom,
rounded up to a multiple of 256 MiB (what Kubernetes and tljh-config are usually given).

Nothing here starts a process or reaches a network: it builds strings and does arithmetic.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from urllib.parse import quote, urlencode, urlsplit

# The map's "run time / peak memory" cell: "10.4 s / 348 MiB" (benchmarks/lesson_map.py writes
# it; a † after it marks a busy machine).
_RESOURCES = re.compile(r"(\d+(?:\.\d+)?)\s*s\s*/\s*(\d+(?:\.\d+)?)\s*Mi?B")
_ROW = re.compile(r"^\|\s*(\d{2})\s*\|\s*\[`?([^`\]]+\.ipynb)`?\]")


@dataclass(frozen=True)
class LessonResources:
    """One row of the lesson map: its number, notebook, and measured run time / peak memory."""
    number: str
    notebook: str
    run_s: float
    peak_mb: float


def lesson_resources(lesson_map: str) -> list[LessonResources]:
    """The lessons whose map row gives a measured run time and peak memory, in map order."""
    rows = []
    for line in lesson_map.splitlines():
        row, figures = _ROW.match(line), _RESOURCES.search(line)
        if row and figures:
            rows.append(LessonResources(row.group(1), row.group(2), float(figures.group(1)),
                                        float(figures.group(2))))
    return rows


def memory_limit_mb(peaks_mb: list[float], *, server_mb: float, kernels: int = 2,
                    headroom: float = 1.25, step_mb: int = 256) -> int:
    """MiB to give each student: (server + kernels × largest peak) × headroom, rounded up."""
    if not peaks_mb or any(not (p > 0) for p in peaks_mb):
        raise ValueError(f"peaks_mb={peaks_mb!r}: expected measured peaks > 0 (lessons/README.md "
                         "lists them; benchmarks/lesson_resources.py measures them)")
    if not (server_mb >= 0):
        raise ValueError(f"server_mb={server_mb!r}: expected the JupyterLab server's MB, >= 0")
    if kernels < 1:
        raise ValueError(f"kernels={kernels}: expected at least one open notebook per student")
    if not (headroom >= 1):
        raise ValueError(f"headroom={headroom!r}: expected a factor >= 1 (1.25 = 25 % spare)")
    if step_mb < 1:
        raise ValueError(f"step_mb={step_mb}: expected a positive rounding step in MiB")
    need = (server_mb + kernels * max(peaks_mb)) * headroom
    return int(math.ceil(need / step_mb) * step_mb)


def nbgitpuller_url(hub: str, *, repo: str, branch: str = "main", path: str = "lessons/README.md",
                    target: str | None = None, app: str = "lab") -> str:
    """A link that pulls `repo`@`branch` into each student's ~/`target` and opens `path` there.

    hub: the hub's address (https://hub.example.edu, or with a base path); repo: the clone URL;
    target: the folder in the student's home (default: the repository's name); app: "lab"
    (JupyterLab) or "tree" (classic file view)."""
    parts = urlsplit(hub)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
        raise ValueError(f"hub={hub!r}: expected the hub's address, http(s)://host[/base], "
                         "with no query or fragment")
    repo_parts = urlsplit(repo)
    if repo_parts.scheme not in ("http", "https") or not repo_parts.path.strip("/"):
        raise ValueError(f"repo={repo!r}: expected a public clone URL, "
                         "https://github.com/OWNER/NAME (nbgitpuller pulls over https)")
    if not branch or any(c.isspace() for c in branch):
        raise ValueError(f"branch={branch!r}: expected a branch or tag name, e.g. 'main'")
    if app not in ("lab", "tree"):
        raise ValueError(f"app={app!r}: expected 'lab' (JupyterLab) or 'tree'")
    name = repo_parts.path.rstrip("/").rsplit("/", 1)[-1].removesuffix(".git")
    target = name if target is None else target
    if not target or target.startswith("/") or ".." in target.split("/"):
        raise ValueError(f"target={target!r}: expected a folder name inside the student's home")
    if path.startswith("/") or ".." in path.split("/"):
        raise ValueError(f"path={path!r}: expected a path inside the repository, "
                         "e.g. 'lessons/README.md'")
    opened = (f"lab/tree/{target}/{path}" if app == "lab" else f"tree/{target}/{path}").rstrip("/")
    query = urlencode({"repo": repo, "branch": branch, "targetpath": target, "urlpath": opened},
                      quote_via=quote, safe="")
    return f"{hub.rstrip('/')}/hub/user-redirect/git-pull?{query}"
