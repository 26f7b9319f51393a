"""A real MLflow tracking server for tests: ``mlflow server`` on a free loopback port, its backend
store a fresh PostgreSQL database of its own (dropped afterwards), artifacts proxied by the server
(``--serve-artifacts``) to a bucket of the tests' S3 API server (deploy/local/s3_server.py) — the shape of a
production deployment (deploy/overlays/production), where clients see only ``http://`` and only the
server holds the object store's keys. ``stop()`` then ``start()`` restarts it on the same port and store, as a
server restarted under its clients.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import s3_server
from live_airflow import BIN, answers, die_with_parent, free_port, signal_group, wait_for
from postgres import fresh_db, pg_uri


class MlflowServer:
    """``uri`` is the tracking URI clients use; ``bucket`` the S3 bucket the server stores artifacts in
    (under ``artifacts/``), made on first start and kept across restarts. With ``auth``, the server runs
    MLflow's basic-auth app, as deploy/base/mlflow.yaml does: every request but ``/health`` needs a
    login, ``login`` is its admin's (user, password)."""

    def __init__(self, root: Path, db: str, workers: int = 1, auth: bool = False) -> None:
        self.root = root
        self.db = db
        self.workers = workers
        self.login = ("admin", secrets.token_urlsafe(12)) if auth else None
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.bucket: str | None = None
        self.log = root / "mlflow-server.log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 120) -> MlflowServer:
        self.bucket = self.bucket or s3_server.bucket("mlflow")
        env = {**os.environ, **s3_server.env(), "PYTHONUNBUFFERED": "1",
               # the GenAI job runner (a huey consumer) is a server of its own that Taxiway never uses
               "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        env.pop("MLFLOW_TRACKING_URI", None)
        app = []
        if self.login is not None:
            ini = self.root / "basic_auth.ini"
            ini.write_text(f"[mlflow]\ndefault_permission = READ\ndatabase_uri = sqlite:///{self.root / 'auth.db'}\n"
                           f"admin_username = {self.login[0]}\nadmin_password = {self.login[1]}\n"
                           "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n")
            env.update(MLFLOW_AUTH_CONFIG_PATH=str(ini), MLFLOW_FLASK_SERVER_SECRET_KEY=secrets.token_hex(16))
            app = ["--app-name", "basic-auth"]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [str(BIN / "mlflow"), "server", *app, "--host", "127.0.0.1", "--port", str(self.port),
                 "--workers", str(self.workers), "--backend-store-uri", pg_uri(self.db),
                 "--serve-artifacts", "--artifacts-destination", f"s3://{self.bucket}/artifacts"],
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
def mlflow_server(root: Path, workers: int = 1, auth: bool = False) -> Iterator[MlflowServer]:
    """A started server on a fresh database; stopped, and its database dropped, on exit."""
    root.mkdir(parents=True, exist_ok=True)
    with fresh_db("taxiway_mlflow") as db:
        server = MlflowServer(root, db, workers, auth)
        try:
            yield server.start()
        finally:
            server.stop()
