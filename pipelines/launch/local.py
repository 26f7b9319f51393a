"""Local gang: N torchrun "nodes" on this host, rendezvous on loopback.

Each node is ``torchrun --nnodes N --node-rank r`` in its own process group (so cancel and
cleanup reach every worker it forked). The handle is a JSON file in the run folder, so a
waiting task that restarts can find the gang again.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from pipelines import atomic
from pipelines.launch.spec import LaunchSpec

RUNNING, SUCCEEDED, FAILED = "running", "succeeded", "failed"


@dataclass
class Handle:
    path: Path              # <run>/train/gang.json
    pids: list[int]
    logs: list[str]

    @classmethod
    def load(cls, path: Path) -> Handle:
        raw = json.loads(path.read_text())
        return cls(path, raw["pids"], raw["logs"])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def submit(spec: LaunchSpec) -> tuple[Handle, list[subprocess.Popen]]:
    port = free_port()
    logs_dir = spec.run_dir / "train" / "logs"
    logs_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **spec.env, "OMP_NUM_THREADS": str(spec.threads_per_proc),
           "PYTHONUNBUFFERED": "1"}
    procs, logs = [], []
    for node in range(spec.nodes):
        log_path = logs_dir / f"node-{node}.log"
        cmd = [sys.executable, "-m", "torch.distributed.run",
               f"--nnodes={spec.nodes}", f"--node-rank={node}", f"--nproc-per-node={spec.procs_per_node}",
               "--master-addr=127.0.0.1", f"--master-port={port}", *spec.trainer_args()]
        with open(log_path, "ab") as log_fh:
            procs.append(subprocess.Popen(cmd, stdout=log_fh, stderr=subprocess.STDOUT, env=env,
                                          start_new_session=True, cwd=spec.run_dir))
        logs.append(str(log_path))
    handle = Handle(spec.run_dir / "train" / "gang.json", [p.pid for p in procs], logs)
    atomic.write_json(handle.path, {"pids": handle.pids, "logs": logs, "port": port,
                                    "started_at": time.time()})
    return handle, procs


def poll(procs: list[subprocess.Popen]) -> str:
    """Succeeded when every node exited 0; failed as soon as any node exits non-zero."""
    codes = [p.poll() for p in procs]
    if any(c not in (None, 0) for c in codes):
        return FAILED
    return SUCCEEDED if all(c == 0 for c in codes) else RUNNING


def cancel(handle: Handle, sig: int = signal.SIGTERM) -> None:
    for pid in handle.pids:
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            pass


def cleanup(handle: Handle, procs: list[subprocess.Popen], grace_s: float = 30.0) -> None:
    """SIGTERM every node's process group, wait ``grace_s``, then SIGKILL what is left."""
    cancel(handle, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    cancel(handle, signal.SIGKILL)
    for p in procs:
        p.wait()


def tail(path: str, lines: int = 30) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return ""


def run(spec: LaunchSpec, poll_s: float = 1.0, on_poll=None) -> None:
    """Submit, wait, always clean up. Raises with the failing node's log tail on failure."""
    handle, procs = submit(spec)
    deadline = time.monotonic() + spec.timeout_s
    try:
        while (state := poll(procs)) == RUNNING:
            if time.monotonic() > deadline:
                raise TimeoutError(f"training gang exceeded compute.timeout_s={spec.timeout_s}")
            if on_poll:
                on_poll()
            time.sleep(poll_s)
        if state == FAILED:
            bad = next(i for i, p in enumerate(procs) if p.returncode not in (None, 0))
            raise RuntimeError(f"node {bad} exited with code {procs[bad].returncode}; "
                               f"log {handle.logs[bad]}:\n{tail(handle.logs[bad])}")
    finally:
        cleanup(handle, procs)
