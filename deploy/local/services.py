"""The servers tests start for themselves (deploy/local/postgres.py, deploy/local/redis_server.py), never the
machine's own: each on a free loopback port, started by the first test that needs it, shared by the
whole pytest session (its xdist workers included) and stopped when the session ends.

A session's servers live in one folder, chosen by the pytest controller before its workers start
(conftest's ``pytest_configure``) and inherited by them as ``TAXIWAY_TEST_SERVICES``. A server's
address is written there once, under a file lock, as ``<name>.json``: pytest-xdist's documented
pattern for a session-wide fixture. A process outside pytest (bench/) gets a session of its own.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock
from live_airflow import free_port

ENV = "TAXIWAY_TEST_SERVICES"
_WATCHDOGS: list[subprocess.Popen] = []  # held, so that no watchdog is garbage-collected while it waits


def session_dir() -> Path:
    """This session's folder. The first call of a session's first process makes it, and a watchdog
    that ends the session once that process is gone, however it went (a SIGTERM runs no atexit)."""
    if ENV not in os.environ:
        root = Path(tempfile.mkdtemp(prefix="taxiway-services-"))
        root.chmod(0o711)  # run as root, PostgreSQL's server is another user, its folder inside this one
        os.environ[ENV] = str(root)
        _WATCHDOGS.append(subprocess.Popen(
            ["sh", "-c", 'tail --pid="$0" -s 0.5 -f /dev/null; exec "$1" -c "$2" "$3"',
             str(os.getpid()), sys.executable, "import sys, services; services.end(sys.argv[1])", str(root)],
            cwd=Path(__file__).parent, start_new_session=True, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return Path(os.environ[ENV])


def shared(name: str, start: Callable[[Path], dict]) -> dict:
    """Server ``name``'s address, started by ``start(folder)`` if this session has none yet. The
    address holds ``stop``, the command that ends the server: the process that ends the session may
    never have imported the module that started it."""
    root = session_dir()
    with FileLock(root / f"{name}.lock"):
        state = root / f"{name}.json"
        if not state.exists():
            state.write_text(json.dumps(start(Path(tempfile.mkdtemp(prefix=f"{name}-", dir=root)))))
        return json.loads(state.read_text())


def on_free_port(start: Callable[[int], dict | None], tries: int = 3) -> dict:
    """``start(port)`` on a free port, again on another while it says ``None`` (taken): a port is
    free only until something binds it, and the suite binds many."""
    for _ in range(tries):
        if (address := start(free_port())) is not None:
            return address
    raise RuntimeError(f"{tries} free ports in a row were taken before the server could bind them")


def end(root: str) -> None:
    """Stop the session's servers and remove its folder. Each server is stopped whatever became of
    the others: one stop command that fails or hangs must not leave PostgreSQL and Redis running."""
    for state in sorted(Path(root).glob("*.json")):
        try:
            subprocess.run(json.loads(state.read_text())["stop"], capture_output=True, timeout=60)
        except (OSError, ValueError, KeyError, subprocess.TimeoutExpired):
            continue
    shutil.rmtree(root, ignore_errors=True)
