"""One gang node: run ``torchrun`` as a child, record its exit code in a file, enforce the cancel grace.

Whoever watches the gang is usually not this process's parent (a retried Airflow task, a
trigger in the triggerer), so it cannot ``wait()`` for an exit status. The exit file gives it
one; a node with neither an exit file nor a live process was killed outright (SIGKILL, OOM).

Cancel is a SIGTERM to the node's process group (sent by a watcher, or by the node itself when
no watcher has polled the gang for ``TAXIWAY_UNWATCHED_S``, or for half the cancel grace while
the lease says a watcher is handing the gang over: an Airflow task deferring to its trigger). The canceller may be gone a moment later (an
Airflow worker gets five seconds for ``on_kill`` before it is killed itself), so the node keeps
the rest of the promise: ``TAXIWAY_CANCEL_GRACE_S`` after the first SIGTERM it SIGKILLs whatever
of its gang is still alive, then writes the exit file.

    python -m pipelines.launch.node EXIT_FILE -- COMMAND...
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from pipelines.launch.local import GRACE_ENV, HANDOFF, LEASE_ENV, MARKER, UNWATCHED_ENV, processes
from trainer.fsio import utc_now, write_json


def _kill_the_rest(gang_id: str | None, child: subprocess.Popen) -> None:
    """SIGKILL the torchrun child and every process carrying this gang's marker, except this one."""
    victims = set(processes(gang_id)) if gang_id else set()
    victims.add(child.pid)
    victims.discard(os.getpid())
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _watch_the_watchers(lease: Path, unwatched_s: float, handoff_s: float) -> None:
    """Cancel this node (SIGTERM to its group) once nobody has polled the gang for ``unwatched_s``,
    or for ``handoff_s`` while one watcher hands it to the next: a cancel that reached no watcher
    must not leave a gang training unwatched."""
    while True:
        time.sleep(min(2.0, handoff_s / 4))
        try:
            idle, text = time.time() - lease.stat().st_mtime, lease.read_text()
        except FileNotFoundError:
            idle, text = float("inf"), ""  # the run folder is gone
        limit, name = (handoff_s, "handoff") if text == HANDOFF else (unwatched_s, UNWATCHED_ENV)
        if idle > limit:
            print(f"{utc_now()} node: no watcher for {idle:.0f}s ({name} limit {limit:g}s): canceling",
                  file=sys.stderr, flush=True)
            os.killpg(os.getpgid(0), signal.SIGTERM)
            return


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m pipelines.launch.node EXIT_FILE -- COMMAND...", file=sys.stderr)
        return 2
    exit_file, cmd = Path(argv[0]), argv[2:]
    grace_s = float(os.environ.get(GRACE_ENV, "30"))
    proc = subprocess.Popen(cmd, restore_signals=True,
                            preexec_fn=lambda: [signal.signal(s, signal.SIG_DFL)
                                                for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)])
    deadline: list[threading.Timer] = []

    def on_cancel(signum: int, frame: object) -> None:
        # The group signal reached torchrun too (it forwards it to its workers); this process
        # only starts the clock, once.
        if not deadline:
            timer = threading.Timer(grace_s, _kill_the_rest, (os.environ.get(MARKER), proc))
            timer.daemon = True
            timer.start()
            deadline.append(timer)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_cancel)
    if lease := os.environ.get(LEASE_ENV):
        threading.Thread(target=_watch_the_watchers, daemon=True,
                         args=(Path(lease), float(os.environ[UNWATCHED_ENV]), max(5.0, grace_s / 2))).start()
    code = proc.wait()
    for timer in deadline:
        timer.cancel()
    write_json(exit_file, {"code": code, "finished_at": utc_now()})
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
