"""A real MLflow tracking server for tests: ``mlflow server`` on a free loopback port, its backend
store a fresh PostgreSQL database of its own (dropped afterwards), artifacts proxied by the server
(``--serve-artifacts``) to a local folder — the shape of a production deployment, where clients
see only ``http://``. ``stop()`` then ``start()`` restarts it on the same port and store, as a
server restarted under its clients.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

from live_airflow import BIN, answers, die_with_parent, free_port, signal_group, wait_for
from postgres import fresh_db, pg_uri


class MlflowServer:
    """``uri`` is the tracking URI clients use; ``artifacts`` the folder the server stores artifacts in."""

    def __init__(self, root: Path, db: str, workers: int = 1) -> None:
        self.root = root
        self.db = db
        self.workers = workers
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.artifacts = root / "artifacts"
        self.log = root / "mlflow-server.log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 120) -> MlflowServer:
        self.artifacts.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONUNBUFFERED": "1",
               # the GenAI job runner (a huey consumer) is a server of its own that Taxiway never uses
               "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        env.pop("MLFLOW_TRACKING_URI", None)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [str(BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(self.port),
                 "--workers", str(self.workers), "--backend-store-uri", pg_uri(self.db),
                 "--serve-artifacts", "--artifacts-destination", str(self.artifacts)],
                env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.root,
                start_new_session=True, preexec_fn=die_with_parent)
        wait_for(f"the MLflow server at {self.uri}", self._healthy, timeout_s, every_s=0.25)
        return self

    def stop(self, grace_s: float = 20) -> None:
        """SIGTERM the server's process group (the CLI, uvicorn and its workers), SIGKILL what is left
        after ``grace_s``; returns when none of them is left, so the port is free to start again."""
        import psutil

        if self.proc is None:
            return
        try:
            family = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            family = []
        signal_group(self.proc.pid, signal.SIGTERM)
        _, alive = psutil.wait_procs(family, timeout=grace_s)
        signal_group(self.proc.pid, signal.SIGKILL)
        psutil.wait_procs(alive, timeout=10)
        self.proc.wait(timeout=10)
        self.proc = None

    def _healthy(self) -> bool:
        return answers(f"{self.uri}/health", {"mlflow server": (self.proc, self.log)})


@contextlib.contextmanager
def mlflow_server(root: Path, workers: int = 1) -> Iterator[MlflowServer]:
    """A started server on a fresh database; stopped, and its database dropped, on exit."""
    root.mkdir(parents=True, exist_ok=True)
    with fresh_db("taxiway_mlflow") as db:
        server = MlflowServer(root, db, workers)
        try:
            yield server.start()
        finally:
            server.stop()
