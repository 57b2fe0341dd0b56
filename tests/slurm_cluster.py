"""A one-node SLURM cluster on this host, for tests: munged, slurmctld and slurmd started from a
generated configuration in a private folder, stopped (and every job cancelled) at the end.

Needs root and Debian's slurmctld, slurmd, slurm-client and munge (`make slurm` installs them);
`missing()` says what is not there, so a fixture can skip with that reason. Ports are free ones
below the ephemeral range (`procs.free_ports`); the munge socket and key, the state and spool
folders live in the folder given, so two clusters (two engineers' test runs) on one host do not
meet. Every wait is bounded; the daemons run in the foreground as children of the caller and
are ended by pid.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from procs import free_ports

COMMANDS = ("munged", "slurmctld", "slurmd", "srun", "sbatch", "squeue", "scontrol", "scancel",
            "sinfo")
NODE = socket.gethostname()  # the node is this host, under its own name: job scripts that
# turn $SLURM_JOB_NODELIST into a rendezvous address (docs/cluster.md) must resolve it


def missing() -> str | None:
    """Why no cluster can be started here (None: it can)."""
    if os.geteuid() != 0:
        return "the SLURM tests start slurmd and slurmctld as root; not root here"
    absent = [c for c in COMMANDS if shutil.which(c) is None]
    if absent:
        return (f"{', '.join(absent)} not found: `make slurm` installs slurmctld, slurmd, "
                "slurm-client and munge with apt-get (Debian, as root)")
    return None


def _config(folder: Path, cpus: int) -> str:
    controller, node = free_ports(2)
    return "\n".join([
        "ClusterName=coursetest",
        f"SlurmctldHost={NODE}(127.0.0.1)",
        f"SlurmctldPort={controller}",
        f"SlurmdPort={node}",
        "AuthType=auth/munge",
        f"AuthInfo=socket={folder}/munge/socket",
        "CredType=cred/munge",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={folder}/state",
        f"SlurmdSpoolDir={folder}/spool",
        f"SlurmctldPidFile={folder}/slurmctld.pid",
        f"SlurmdPidFile={folder}/slurmd.pid",
        f"SlurmctldLogFile={folder}/log/slurmctld.log",
        f"SlurmdLogFile={folder}/log/slurmd.log",
        "ProctrackType=proctrack/linuxproc",  # no cgroups needed
        "TaskPlugin=task/none",
        "SwitchType=switch/none",
        "MpiDefault=none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",  # array tasks share the node, one CPU each
        "ReturnToService=2",
        "KillWait=5",
        # sbatch --wait polls after 2 s, then 4× longer each time (up to 32 s) while the wait is
        # under MinJobAge/2: with 4 s it keeps polling every 2 s instead of 2, 8, 32, 32 s.
        "MinJobAge=4",
        f"NodeName={NODE} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN",
        f"PartitionName=test Nodes={NODE} Default=YES MaxTime=INFINITE State=UP",
        "",
    ])


class Cluster:
    """The running cluster: `env` (SLURM_CONF set) for client commands, `run` to call one."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.conf = folder / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.daemons: list[subprocess.Popen] = []

    def run(self, cmd: list[str], *, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(cmd, env=self.env, capture_output=True, text=True,
                              timeout=timeout, **kwargs)

    def _start(self, cmd: list[str], log: str) -> None:
        with open(self.folder / "log" / log, "w") as out:
            self.daemons.append(subprocess.Popen(cmd, env=self.env, stdout=out,
                                                 stderr=subprocess.STDOUT))

    def _wait(self, what: str, ready, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            dead = [d.args[0] for d in self.daemons if d.poll() is not None]
            if dead or time.monotonic() > deadline:
                logs = "\n".join(f"--- {p.name}\n{p.read_text()[-1500:]}"
                                 for p in sorted((self.folder / "log").iterdir()))
                why = "exited: " + ", ".join(dead) if dead else "timeout"
                raise RuntimeError(f"SLURM test cluster: {what} not ready ({why})\n{logs}")
            time.sleep(0.2)

    def start(self, *, timeout: float = 60) -> "Cluster":
        f = self.folder
        for sub in ("munge", "state", "spool", "log"):
            (f / sub).mkdir(parents=True, exist_ok=True)
        f.chmod(0o711)  # munge refuses a socket folder others cannot traverse
        (f / "munge").chmod(0o711)
        key = f / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        self._start(["munged", "--force", "--foreground", f"--socket={f}/munge/socket",
                     f"--key-file={key}", f"--pid-file={f}/munge/munged.pid",
                     f"--log-file={f}/log/munged.log", f"--seed-file={f}/munge/seed"],
                    "munged.out")
        self._wait("munged", lambda: (f / "munge" / "socket").exists(), timeout)
        self.conf.write_text(_config(f, os.cpu_count() or 1))
        self._start(["slurmctld", "-D", "-f", str(self.conf)], "slurmctld.out")
        self._wait("slurmctld", lambda: self.run(["scontrol", "ping"]).stdout.count("UP") > 0,
                   timeout)
        self._start(["slurmd", "-D", "-f", str(self.conf), "-N", NODE], "slurmd.out")
        self._wait("slurmd", lambda: self.run(["sinfo", "-h", "-o", "%T"]).stdout.strip()
                   in ("idle", "mixed", "allocated"), timeout)
        return self

    def stop(self, *, timeout: float = 30) -> None:
        """Cancel every job, wait for the queue to empty, then end the daemons by pid."""
        if self.daemons and all(d.poll() is None for d in self.daemons):
            try:
                self.run(["scancel", "--full", "--user", "root"], timeout=timeout)
                deadline = time.monotonic() + timeout
                while self.run(["squeue", "-h"], timeout=timeout).stdout.strip() and \
                        time.monotonic() < deadline:
                    time.sleep(0.5)
            except (subprocess.SubprocessError, OSError):
                pass  # the daemons are ended below either way
        for d in reversed(self.daemons):  # slurmd, slurmctld, munged
            if d.poll() is None:
                d.send_signal(signal.SIGTERM)
                try:
                    d.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    d.kill()
                    d.wait()
