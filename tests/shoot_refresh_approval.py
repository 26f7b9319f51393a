"""Makes docs/screenshots/refresh-approval-waiting.png: a ``taxiway_refresh`` run of a deployment with
``registry.approval: required`` waiting in ``register.approval``, as a person sees it in Airflow's
*Required actions* (the evaluation on both sets). Not a test of its own (tests/test_live_approval.py
proves approve, reject and timeout); a deployment of its own, since a refresh waiting for approval
holds the shared one's refreshes. Run it by name:

    TAXIWAY_SCREENSHOTS=docs/screenshots .venv/bin/pytest -p no:randomly tests/shoot_refresh_approval.py
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import pytest
from live_airflow import LiveAirflow, wait_for
from refresh_batches import new_files, register_champion, source

from conftest import TINY, sign_in

DAG = "taxiway_refresh"


@pytest.mark.timeout(900)  # a champion, a deployment's start and a refresh up to its approval
def test_shoot_a_refresh_waiting_for_approval(postgres_db, browser, shots: Path, tmp_path: Path, monkeypatch):
    from postgres import pg_uri

    from pipelines.config import load_config
    from pipelines.demo_data import write_demo_data
    from pipelines.refresh import landing

    config = tmp_path / "configs" / "approval.yaml"
    config.parent.mkdir(parents=True)
    config.write_text(f"extends: {TINY}\nregistry:\n  approval: required\n")
    monkeypatch.delenv("TAXIWAY_DATA_ROOTS", raising=False)  # the test's own (conftest): the deployment keeps its default
    live = LiveAirflow(tmp_path, metadata_uri=pg_uri(postgres_db), extra_env={"TAXIWAY_CONFIG": str(config)})
    monkeypatch.setenv("TAXIWAY_HOME", str(live.taxiway_home))
    write_demo_data(live.taxiway_home / "demo-data", seed=0, max_files=160)
    register_champion(live.taxiway_home)
    landing.land(source(tmp_path / "b1", new_files(live.taxiway_home / "demo-data", 0, 24)),
                 load_config(config).refresh.landing, batch_id="b1")
    live.start()
    try:
        live.wait_dag(DAG)
        live.unpause(DAG)
        assert live.trigger(DAG, {}).status_code == 200  # or the cron's run, made when the DAG is unpaused

        def waiting() -> str | None:
            runs = live.api.get(f"/api/v2/dags/{DAG}/dagRuns").json()["dag_runs"]
            return next((r["dag_run_id"] for r in runs if live.task_instances(DAG, r["dag_run_id"]).get(
                "register.approval", {}).get("state") == "awaiting_input"), None)

        run_id = wait_for("a refresh to wait for approval", waiting, 420, every_s=2)
        page = browser.new_page(viewport={"width": 1440, "height": 1100})
        page.set_default_timeout(60_000)
        sign_in(page, live.url, live.password)
        page.goto(f"{live.url}/dags/{DAG}/runs/{quote(run_id, safe='')}/tasks/register.approval/required_actions")
        page.get_by_text("passed its gate and waits for your approval").first.wait_for()
        page.screenshot(path=shots / "refresh-approval-waiting.png", full_page=True)
    finally:
        live.stop()
