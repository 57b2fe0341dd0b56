"""The fork server: ``python -m autograder.sandbox.zygote``, started by the grader per grade.

It imports torch and the rank-side modules once (about 2 s), then forks the ranks of each
launch on request (milliseconds), so no launch pays for an interpreter start. It never runs
student code and never holds a grade's secret or inputs: those reach a rank only through its
channel, after the fork. A child inherits this process's memory, so what is here is what any
rank could find in its own: nothing but code.

Control protocol, on a SOCK_SEQPACKET socket whose descriptor is the one argument (JSON, one
message each):

* grader → server: ``{"fork": spec}`` with 3·p descriptors attached (each rank's channel,
  stdout and stderr, SCM_RIGHTS); server → grader: ``{"forked": [pid, ...]}``;
* server → grader, instead: ``{"refused": why}`` when the sandbox cannot be built here (the
  grade then refuses to run ranks, `server.SandboxRefused`);
* server → grader: ``{"exited": pid, "code": n}`` when a rank it forked ends (negative: the
  signal), as waitpid says;
* end of file on the socket: the server exits (its ranks are the grader's to kill).

Each rank is forked as pid 1 of a pid namespace of its own (`namespaces.fork_isolated`: as
root one fork, as before; as a user through an intermediate process, the server being a child
subreaper that adopts the rank). Before the first launch's ranks the server forks a probe the
same way: a rank 0 that builds its whole world (`confine`) and checks it from inside (uid,
capabilities, mounts, processes, a write to the root) without running anything else. If any
step fails, the server answers ``refused`` and no rank runs. The server keeps root's
capabilities when it has them: each rank builds its world before it gives them up
(`confine`).
"""

from __future__ import annotations

import functools
import json
import os
import select
import socket
import sys
from typing import NoReturn

from .namespaces import IsolationError, fork_isolated, set_subreaper
from .probe_world import check_probe, inspect

MAX_MESSAGE = 1 << 20


def _child(spec: dict, rank_spec: dict, fds: tuple[int, int, int]) -> NoReturn:
    code = 1
    try:
        from . import rank
        from .channel import send_frame
        from .confine import CHANNEL_FD, confine

        report = confine({**spec, **rank_spec}, channel=fds[0], out=fds[1], err=fds[2])
        sock = socket.socket(fileno=CHANNEL_FD)
        send_frame(sock, {"k": "hello", "confined": report})
        rank.main(sock, {**spec, **rank_spec})
    except BaseException:  # noqa: BLE001 - say why on stderr, which the grader reads
        import traceback

        try:
            os.write(2, traceback.format_exc().encode(errors="replace"))
        except OSError:
            pass
    finally:
        os._exit(code)


def _fork(spec: dict, fds: list[int]) -> list[int]:
    pids = []
    try:
        for k, rank_spec in enumerate(spec.pop("ranks")):
            mine = tuple(fds[3 * k:3 * k + 3])
            if spec.get("unconfined"):
                pid = os.fork()
                if pid == 0:
                    _child(spec, rank_spec, mine)
            else:
                pid = fork_isolated(functools.partial(_child, spec, rank_spec, mine))
            pids.append(pid)
    finally:
        for fd in fds:
            os.close(fd)
    return pids


def _probe_child(spec: dict, write: int) -> NoReturn:
    """A rank that builds its world and checks it from inside, then exits: its answer (JSON:
    its report and what it saw, or the error) goes down the pipe, which `confine` keeps as the
    rank's channel (fd 3)."""
    from .confine import CHANNEL_FD, confine

    try:
        os.dup2(write, CHANNEL_FD)
        null = os.open(os.devnull, os.O_WRONLY)
        report = confine(spec, channel=CHANNEL_FD, out=null, err=null)
        answer = {"confined": report, "seen": inspect(spec)}
    except BaseException as exc:  # noqa: BLE001 - the words go back to the grader
        answer = {"error": str(exc) or type(exc).__name__}
    try:
        os.write(CHANNEL_FD, json.dumps(answer).encode())
    finally:
        os._exit(0)


def _probe(spec: dict) -> dict:
    """Run `_probe_child` for rank 0 of `spec`; {"confined": ..., "seen": ...} or
    {"refused": why}."""
    read, write = os.pipe()
    rank = dict(spec, **spec["ranks"][0])
    rank.pop("ranks")
    try:
        pid = fork_isolated(lambda: _probe_child(rank, write))
    except IsolationError as exc:
        os.close(read)
        os.close(write)
        return {"refused": str(exc)}
    os.close(write)
    answer = b""
    while chunk := os.read(read, 65536):
        answer += chunk
    os.close(read)
    os.waitpid(pid, 0)
    try:
        got = json.loads(answer)
    except ValueError:
        return {"refused": "the sandbox's probe died before it could say why"}
    if "error" in got:
        return {"refused": got["error"]}
    problems = check_probe(got["seen"])
    return {"refused": "; ".join(problems)} if problems else got


def _reap(control: socket.socket, children: set[int]) -> None:
    for pid in list(children):
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            children.discard(pid)
            continue
        if done:
            children.discard(pid)
            code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            control.send(json.dumps({"exited": pid, "code": code}).encode())


def serve(control: socket.socket) -> None:
    children: set[int] = set()
    probed: dict | None = None
    control.send(json.dumps({"ready": os.getpid()}).encode())
    while True:
        ready, _, _ = select.select([control], [], [], 0.02)
        _reap(control, children)
        if not ready:
            continue
        message, fds, _, _ = socket.recv_fds(control, MAX_MESSAGE, 64)
        if not message:
            return
        spec = json.loads(message)["fork"]
        if probed is None and not spec.get("unconfined"):
            probed = _probe(spec)
        if probed is not None and "refused" in probed:
            for fd in fds:
                os.close(fd)
            control.send(json.dumps({"refused": probed["refused"]}).encode())
            continue
        try:
            pids = _fork(spec, list(fds))
        except IsolationError as exc:
            control.send(json.dumps({"refused": str(exc)}).encode())
            continue
        children.update(pids)
        control.send(json.dumps({"forked": pids}).encode())


def _warm() -> None:
    """Run torch's lazily initialised paths once here (the meta device, a module's forward and
    backward), so that no forked rank pays for them again: building a small model on the meta
    device costs about 0.3 s the first time in a process and 2 ms after. Generic torch calls
    only; nothing of any lab or submission. With GPUs visible (a cuda grade) the backward is
    skipped: autograd's first backward starts the CUDA driver on a machine with GPUs, and a
    driver live in the fork server fails every forked rank's first CUDA call."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    with torch.device("meta"):
        layer = nn.Linear(4, 3)
    layer = layer.to_empty(device="cpu")
    with torch.no_grad():
        layer.weight.normal_()
        layer.bias.zero_()
    x = torch.randn(2, 4, requires_grad=True)
    loss = F.mse_loss(F.relu(F.gelu(layer(x))), torch.zeros(2, 3))
    if os.environ.get("CUDA_VISIBLE_DEVICES", "") == "":
        loss.backward()


def main() -> None:
    import torch

    torch.set_num_threads(1)  # no thread pool to copy into forked children
    import torch.distributed  # noqa: F401 - imported once here, not in every rank

    from . import confine, rank  # noqa: F401 - the rank-side modules, likewise

    _warm()

    set_subreaper()  # as a user, a rank is adopted here when its intermediate exits
    control = socket.socket(fileno=int(sys.argv[1]))
    try:
        serve(control)
    except (BrokenPipeError, ConnectionError, EOFError):
        pass
    sys.exit(0)


if __name__ == "__main__":
    main()
