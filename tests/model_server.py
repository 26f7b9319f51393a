"""``mlflow models serve`` of a registered version, as a user serves the champion: the CLI on a free
loopback port in this environment (``--env-manager local``), the model resolved through the tracking
server. ``served`` yields the base URL once ``/ping`` answers and stops the process group after."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

from live_airflow import BIN, answers, die_with_parent, free_port, signal_group, wait_for


@contextlib.contextmanager
def served(model_uri: str, tracking_uri: str, log: Path, timeout_s: float = 300) -> Iterator[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # the CLI execs uvicorn by name: this environment's bin first, as in an activated venv
    env = {**os.environ, "MLFLOW_TRACKING_URI": tracking_uri, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    with open(log, "ab") as out:
        proc = subprocess.Popen([str(BIN / "mlflow"), "models", "serve", "-m", model_uri, "--env-manager", "local",
                                 "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                                env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, preexec_fn=die_with_parent)

    try:
        wait_for(f"mlflow models serve of {model_uri}", lambda: answers(f"{url}/ping", {"mlflow models serve": (proc, log)}),
                 timeout_s, every_s=0.25,
                 explain=lambda: log.read_text(errors="replace")[-3000:])
        yield url
    finally:
        signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            signal_group(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
