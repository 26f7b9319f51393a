"""Local gang: N torchrun "nodes" on this host, rendezvous on loopback.

Each node is ``python -m pipelines.launch.node EXIT -- torchrun --nnodes N --node-rank r …`` in
its own session, so cancel reaches it as a group and its exit code lands in a file. The handle
(``<run>/train/gang.json``) is plain JSON: a retried Airflow task or a trigger in another
process finds the gang again, tells its state from files and ``/proc`` alone, and never needs
to be the nodes' parent. Every process of a gang carries ``TAXIWAY_GANG=<id>`` in its
environment; torchrun starts its workers in new sessions, so that marker (not the process
group) is how cleanup finds all of them, orphans included.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path

from pipelines.errors import CheckFailed, Transient
from pipelines.launch.spec import LaunchSpec
from pipelines.run_folder import RunFolder, State
from trainer import fsio
from trainer.fsio import utc_now

RUNNING, SUCCEEDED, FAILED = State.RUNNING, State.SUCCEEDED, State.FAILED
MARKER = "TAXIWAY_GANG"


class GangFailed(Transient):
    """A node failed or vanished; a relaunch resumes from the newest valid checkpoint."""


class GangTimedOut(CheckFailed):
    """The gang ran past ``compute.timeout_s``: a budget, not retried."""


GRACE_ENV = "TAXIWAY_CANCEL_GRACE_S"  # read by each node: SIGKILL the gang this long after a cancel
UNWATCHED_ENV = "TAXIWAY_UNWATCHED_S"  # read by each node: cancel itself when no watcher polled this long
LEASE_ENV = "TAXIWAY_LEASE"


@dataclass(frozen=True)
class Node:
    rank: int
    pid: int
    start_ticks: int      # /proc/<pid>/stat starttime: tells our pid from a reused one
    log: str
    exit_file: str


@dataclass(frozen=True)
class Handle:
    path: Path            # <run>/train/gang.json
    gang_id: str
    attempt: int          # 1 for the first launch of this run, +1 per relaunch
    nodes: list[Node]
    started_at: str

    @classmethod
    def load(cls, path: Path) -> Handle:
        raw = json.loads(Path(path).read_text())
        return cls(Path(path), raw["gang_id"], raw["attempt"], [Node(**n) for n in raw["nodes"]],
                   raw["started_at"])

    @property
    def started(self) -> float:
        """When it was launched, in epoch seconds."""
        return datetime.fromisoformat(self.started_at).timestamp()

    def save(self) -> None:
        fsio.write_json(self.path, {"gang_id": self.gang_id, "attempt": self.attempt,
                                      "nodes": [asdict(n) for n in self.nodes], "started_at": self.started_at})


@dataclass(frozen=True)
class GangState:
    state: str            # running | succeeded | failed
    detail: str = ""      # for failed: which node and why, with its log tail


def handle_path(run_dir: Path) -> Path:
    return RunFolder(run_dir).gang


def current(run_dir: Path) -> Handle | None:
    """The run's newest gang, None before the first launch."""
    path = handle_path(run_dir)
    return Handle.load(path) if path.exists() else None


def lease_path(run_dir: Path) -> Path:
    """Touched by every ``poll``: its age tells the nodes how long nobody has watched the gang.
    Its text says who watches: ``handoff`` while one watcher hands the gang to the next (an Airflow
    task deferring to its trigger), ``watched`` otherwise."""
    return RunFolder(run_dir).gang_lease


HANDOFF, WATCHED = "handoff", "watched"


def hand_over(handle: Handle) -> None:
    """The current watcher is leaving; the next must ``take_over`` within half the cancel grace, or
    the nodes cancel themselves (a cancel landing in between would otherwise reach nobody)."""
    fsio.write_text(RunFolder.of_gang(handle.path).gang_lease, HANDOFF)


def take_over(handle: Handle) -> None:
    fsio.write_text(RunFolder.of_gang(handle.path).gang_lease, WATCHED)


def launched_here(handle: Handle) -> bool:
    """This process launched the gang (``submit`` puts its pid in the gang id)."""
    return handle.gang_id.rsplit("-", 2)[-2] == str(os.getpid())


def free_port() -> int:
    """A free loopback port for a server (the gang's rendezvous; the tests' servers), picked at random
    below the kernel's ephemeral range. Not ``bind(0)``: that hands out an ephemeral port, which between
    this probe and the server's own bind may become the source port of any outgoing connection on the
    machine (a gloo connection, an HTTP client), and the server then fails "address already in use"
    (seen in CI, a test's MLflow server). Below the range no outgoing connection is given it; the bind
    here skips what a service already holds."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    pick = random.SystemRandom()
    while True:
        port = pick.randrange(10000, low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


def _start_ticks(pid: int) -> int | None:
    """Start time of a live (non-zombie) process, None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return None if fields[0] in ("Z", "X") else int(fields[19])


def submit(spec: LaunchSpec) -> Handle:
    """Start every node now; a previous gang of this run is cleaned up first."""
    path = handle_path(spec.run_dir)
    attempt = 1
    if path.exists():
        previous = Handle.load(path)
        cleanup(previous, spec.cancel_grace_s)  # a canceled gang may still be saving its checkpoint
        attempt = previous.attempt + 1
    gang_id = f"{spec.run_dir.name}-{attempt}-{os.getpid()}-{time.time_ns()}"
    attempt_dir = RunFolder(spec.run_dir).attempt_logs(attempt)
    attempt_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {**os.environ, **spec.env, MARKER: gang_id, "OMP_NUM_THREADS": str(spec.threads_per_proc),
           "PYTHONUNBUFFERED": "1", "TAXIWAY_GANG_ATTEMPT": str(attempt),
           GRACE_ENV: str(spec.cancel_grace_s),
           UNWATCHED_ENV: str(spec.unwatched_timeout_s), LEASE_ENV: str(lease_path(spec.run_dir))}
    fsio.write_text(lease_path(spec.run_dir), WATCHED)
    nodes = []
    for rank in range(spec.nodes):
        log, exit_file = attempt_dir / f"node-{rank}.log", attempt_dir / f"node-{rank}.exit.json"
        torchrun = [sys.executable, "-m", "torch.distributed.run",
                    f"--nnodes={spec.nodes}", f"--node-rank={rank}", f"--nproc-per-node={spec.procs_per_node}",
                    "--master-addr=127.0.0.1", f"--master-port={port}", *spec.trainer_args()]
        with open(log, "ab") as fh:
            proc = subprocess.Popen([sys.executable, "-m", "pipelines.launch.node", str(exit_file), "--", *torchrun],
                                    stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                    start_new_session=True, cwd=spec.run_dir)
        nodes.append(Node(rank, proc.pid, _start_ticks(proc.pid) or 0, str(log), str(exit_file)))
    handle = Handle(path, gang_id, attempt, nodes, utc_now())
    handle.save()
    return handle


def _node_state(node: Node) -> tuple[str, int | None]:
    """(running | exited | lost, exit code)."""
    try:
        return "exited", json.loads(Path(node.exit_file).read_text())["code"]
    except FileNotFoundError:
        pass
    ticks = _start_ticks(node.pid)
    if ticks is not None and ticks == node.start_ticks:
        return "running", None
    try:  # it may have written the file between the two looks
        return "exited", json.loads(Path(node.exit_file).read_text())["code"]
    except FileNotFoundError:
        return "lost", None


def poll(handle: Handle) -> GangState:
    """Succeeded when every node exited 0; failed as soon as one node failed or vanished.
    Renews the watch lease: a gang that nobody polls stops itself (``compute.unwatched_timeout_s``)."""
    try:
        RunFolder.of_gang(handle.path).gang_lease.touch()
    except FileNotFoundError:  # the run folder is gone
        pass
    states = [(n, *_node_state(n)) for n in handle.nodes]
    for node, state, code in states:
        if state == "lost":
            return GangState(FAILED, f"node {node.rank} vanished (killed without an exit status); "
                                     f"log {node.log}:\n{tail(node.log)}")
        if state == "exited" and code != 0:
            return GangState(FAILED, f"node {node.rank} exited with code {code}; log {node.log}:\n{tail(node.log)}")
    if all(state == "exited" for _, state, _ in states):
        return GangState(SUCCEEDED)
    return GangState(RUNNING)


def processes(gang_id: str, rank: int | None = None) -> list[int]:
    """Every live process of this gang, found by its environment marker (orphans included); with
    ``rank``, only the trainer worker of that global rank (torchrun sets ``RANK`` for workers only)."""
    wanted = {f"{MARKER}={gang_id}".encode()} | ({f"RANK={rank}".encode()} if rank is not None else set())
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if wanted <= set((entry / "environ").read_bytes().split(b"\0")) and _start_ticks(int(entry.name)):
                found.append(int(entry.name))
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return found


def _group(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


USER, CLEANUP = "user", "cleanup"  # why a gang was canceled: a user's action, or cleanup after it ended


def _cancel_marker(handle: Handle) -> Path:
    return RunFolder.of_gang(handle.path).gang_canceled


def cancel_reason(handle: Handle) -> str | None:
    """Why this gang was canceled (``USER`` or ``CLEANUP``; None when it was not): a gang a user
    canceled may still be saving its checkpoint, and is never re-attached to."""
    try:
        gang_id, _, why = _cancel_marker(handle).read_text().partition("\n")
    except FileNotFoundError:
        return None
    return why if gang_id == handle.gang_id else None


def cancel(handle: Handle, why: str = CLEANUP) -> None:
    """SIGTERM every node's process group and every process of the gang, then SIGCONT them (a
    stopped process cannot act on SIGTERM). The trainer saves a checkpoint and exits 143; each
    node SIGKILLs what is left of the gang after ``cancel_grace_s``, so the caller may go away.
    Once per gang: the trigger and a relaunching retry may both cancel it, and a second SIGTERM
    would cut short torchrun's own shutdown (it dies of it, -15)."""
    if cancel_reason(handle):
        return
    fsio.write_text(_cancel_marker(handle), f"{handle.gang_id}\n{why}")
    _log_to_nodes(handle, f"{utc_now()} cancel ({why}) sent by pid {os.getpid()}: {' '.join(sys.argv[:3])}")
    groups = [n.pid for n in handle.nodes if _node_state(n)[0] == "running"]
    members = [p for p in processes(handle.gang_id) if _group(p) not in groups]  # workers: own sessions
    for sig in (signal.SIGTERM, signal.SIGCONT):
        for pgid in groups:
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                pass
        _signal_all(members, sig)


def _log_to_nodes(handle: Handle, line: str) -> None:
    """Say in every node's log who stopped the gang: its log then tells a cancel from a crash."""
    for node in handle.nodes:
        try:
            with open(node.log, "a") as fh:
                fh.write(line + "\n")
        except FileNotFoundError:  # the run folder is gone
            pass


def cleanup(handle: Handle, grace_s: float = 30.0) -> int:
    """Cancel, wait up to ``grace_s`` for a clean exit, then SIGKILL whatever is left.

    Returns how many processes had to be killed. Afterwards no process of the gang remains.
    """
    cancel(handle)
    deadline = time.monotonic() + grace_s
    while (left := processes(handle.gang_id)) and time.monotonic() < deadline:
        time.sleep(0.2)
    _signal_all(left, signal.SIGKILL)
    while processes(handle.gang_id):
        time.sleep(0.05)
    return len(left)


def tail(path: str, lines: int = 30) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return ""


def run_to_end(spec: LaunchSpec, poll_s: float = 1.0, on_poll: Callable[[], None] | None = None) -> None:
    """Submit, wait, always clean up. Raises with the failing node's log tail on failure."""
    handle = submit(spec)
    deadline = time.monotonic() + spec.timeout_s
    try:
        while (state := poll(handle)).state == RUNNING:
            if time.monotonic() > deadline:
                raise GangTimedOut(f"training gang exceeded compute.timeout_s={spec.timeout_s}")
            if on_poll:
                on_poll()
            time.sleep(poll_s)
        if state.state == FAILED:
            raise GangFailed(state.detail)
    finally:
        cleanup(handle)
