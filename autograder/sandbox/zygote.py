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
* server → grader: ``{"exited": pid, "code": n}`` when a rank it forked ends (negative: the
  signal), as waitpid says;
* end of file on the socket: the server exits (its ranks are the grader's to kill).

The server keeps root's capabilities when it has them: each child makes its own network and IPC
namespaces before it drops them (`confine`).
"""

from __future__ import annotations

import json
import os
import select
import socket
import sys
from typing import NoReturn

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
    for k, rank_spec in enumerate(spec.pop("ranks")):
        mine = tuple(fds[3 * k:3 * k + 3])
        pid = os.fork()
        if pid == 0:
            _child(spec, rank_spec, mine)
        pids.append(pid)
    for fd in fds:
        os.close(fd)
    return pids


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
    control.send(json.dumps({"ready": os.getpid()}).encode())
    while True:
        ready, _, _ = select.select([control], [], [], 0.02)
        _reap(control, children)
        if not ready:
            continue
        message, fds, _, _ = socket.recv_fds(control, MAX_MESSAGE, 64)
        if not message:
            return
        request = json.loads(message)
        pids = _fork(request["fork"], list(fds))
        children.update(pids)
        control.send(json.dumps({"forked": pids}).encode())


def _warm() -> None:
    """Run torch's lazily initialised paths once here (the meta device, a module's forward and
    backward), so that no forked rank pays for them again: building a small model on the meta
    device costs about 0.3 s the first time in a process and 2 ms after. Generic torch calls
    only; nothing of any lab or submission."""
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
    F.mse_loss(F.relu(F.gelu(layer(x))), torch.zeros(2, 3)).backward()


def main() -> None:
    import torch

    torch.set_num_threads(1)  # no thread pool to copy into forked children
    import torch.distributed  # noqa: F401 - imported once here, not in every rank

    from . import confine, rank  # noqa: F401 - the rank-side modules, likewise

    _warm()

    control = socket.socket(fileno=int(sys.argv[1]))
    try:
        serve(control)
    except (BrokenPipeError, ConnectionError, EOFError):
        pass
    sys.exit(0)


if __name__ == "__main__":
    main()
