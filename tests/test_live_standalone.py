"""``make airflow``, as the README tells a user to start Airflow on one machine: ``airflow standalone``
on SQLite with Taxiway's DAGs and the demo corpus, in a home of its own on free ports. The api-server
answers, the generated admin password logs in, every Taxiway DAG is parsed without an import error,
and ^C stops every component."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import httpx
import psutil
import pytest
from live_airflow import free_port, wait_for

from conftest import REPO

DAGS = {"taxiway_train", "taxiway_refresh", "taxiway_sweep", "taxiway_land"}


@pytest.mark.live
def test_make_airflow_serves_every_dag_and_stops_on_ctrl_c(tmp_path: Path):
    home = tmp_path / "taxiway"
    port = free_port()
    env = {**os.environ, "TAXIWAY_HOME": str(home), "AIRFLOW_HOME": str(home / "airflow"),
           "AIRFLOW__API__PORT": str(port), "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
           "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port())}
    env.pop("TAXIWAY_CONFIG", None)  # the Makefile's own default, configs/demo.yaml
    log = tmp_path / "make-airflow.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(["make", "--no-print-directory", "airflow"], cwd=REPO, env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"

    def explain() -> str:
        return log.read_text(errors="replace")[-3000:]

    def up() -> bool:
        assert proc.poll() is None, f"make airflow exited {proc.returncode}:\n{explain()}"
        try:
            return httpx.get(f"{url}/api/v2/monitor/health", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for("make airflow's api-server", up, 240, every_s=1, explain=explain)
        password = json.loads((home / "airflow" / "simple_auth_manager_passwords.json.generated").read_text())["admin"]
        token = httpx.post(f"{url}/auth/token", json={"username": "admin", "password": password}, timeout=30)
        token.raise_for_status()
        api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token.json()['access_token']}"},
                           timeout=30)
        parsed = wait_for("every Taxiway DAG to be parsed", lambda: DAGS <= {
            d["dag_id"] for d in api.get("/api/v2/dags").json()["dags"]}, 180, every_s=2, explain=explain)
        assert parsed
        errors = api.get("/api/v2/importErrors").json()
        assert errors["total_entries"] == 0, errors
        assert (home / "demo-data" / "manifest.jsonl").exists()
        api.close()
    finally:
        group = psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []
        os.killpg(proc.pid, signal.SIGINT)  # ^C in the terminal: the whole foreground group
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    _, alive = psutil.wait_procs(group, timeout=30)
    assert group and not alive, f"left running after ^C: {[p.pid for p in alive]}\n{explain()}"
