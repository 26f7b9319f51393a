"""The Airflow UI as a training console, checked in a real browser: Debian's ``chromium`` driven by
Playwright (pinned; no browser download) against the live api-server. It logs in on the login page,
opens the "Training runs" view from the navigation entry, a run's page, the trigger form of
``taxiway_train``, the register task's extra links (following "Eval report"), and a failed run's
note in the grid; and the batches page, where a quarantined batch is released. Screenshots go to ``TAXIWAY_SCREENSHOTS`` (the README's are made with
``TAXIWAY_SCREENSHOTS=docs/screenshots``), else to the test's temporary folder."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import quote

import pytest
from live_airflow import USERS, settings, wait_for

from conftest import sign_in

DAG = "taxiway_train"
pytestmark = [pytest.mark.live, pytest.mark.browser]


def test_a_retried_run_and_a_failed_one_in_the_browser(live_airflow, browser, shots: Path, monkeypatch):
    """Two runs, then the console a user reads them in: the Training runs view, a run's page, the
    trigger form, the register task's extra links, the failed run's note. The good run's registration
    first meets the champion lock held elsewhere: its first try fails as transient (``LockTimeout``),
    the scheduler retries it after the back-off and it succeeds, no other task retried — a retry under
    a live scheduler, which ``dag.test()`` would run inline. The other run names data outside the data roots
    (what the api-server cannot judge: its first task does)."""
    from pipelines.registry.locks import champion_lock

    live = live_airflow
    live.as_deployment(monkeypatch)  # the lock file beside the live run's mlflow.db
    own = settings("registry:\n  model_name: live-ui\n  lock_timeout_s: 2\n")
    with champion_lock(None, "live-ui", timeout_s=60):
        good = live.trigger(DAG, {**own, "train": {"seed": 11}})
        bad = live.trigger(DAG, {"data": {"train": "/etc"}})  # outside the data roots: resolve_config fails, naming it
        assert good.status_code == bad.status_code == 200, (good.text, bad.text)
        good_id, bad_id = good.json()["dag_run_id"], bad.json()["dag_run_id"]
        wait_for("registration's first try to fail", lambda: live.task_instances(DAG, good_id).get(
            "register.model_version", {}).get("state") in ("up_for_retry", "failed", "success"), 240, every_s=1)
    assert live.wait_run(DAG, good_id, timeout_s=120)["state"] == "success"
    tries = {k: (ti["state"], ti["try_number"]) for k, ti in live.task_instances(DAG, good_id).items()}
    assert tries.pop("register.model_version") == ("success", 2), tries
    assert {tries.pop(f"register.{t}")[0] for t in ("approval", "approval_reminder", "decision")} == {"skipped"}
    assert set(tries.values()) == {("success", 1)}, tries
    assert "still locked after 2 s" in (live.task_log(DAG, good_id, "register.model_version", 1) or "")
    assert live.wait_run(DAG, bad_id, timeout_s=60)["state"] == "failed"

    page = browser.new_page(viewport={"width": 1440, "height": 900})
    page.set_default_timeout(60_000)
    try:
        _walk_the_console(page, live, good_id, bad_id, shots)
    except Exception:
        page.screenshot(path=shots / "at-failure.png", full_page=True)  # kept with the failed test's folder
        raise


def _walk_the_console(page, live, good_id: str, bad_id: str, shots: Path) -> None:
    from playwright.sync_api import expect

    sign_in(page, live.url, live.password)

    # the view, from its entry in the navigation (Browse → Training runs: an iframe in Airflow's own page)
    page.get_by_role("button", name="Browse").click()
    page.get_by_role("menuitem", name="Training runs").click()
    page.wait_for_url("**/plugin/training-runs")
    view = page.frame_locator("iframe").first
    row = view.locator(f"tr[data-run-id='{good_id}']")
    expect(row).to_contain_text("succeeded")
    expect(row).to_contain_text("30/30")
    expect(row.locator("svg.sparkline polyline")).to_have_count(1)
    expect(row).to_contain_text("live-ui v")
    expect(view.locator(f"tr[data-run-id='{bad_id}']")).to_contain_text("failed at resolve_config: data.train:")
    page.screenshot(path=shots / "runs-view.png")

    page.goto(f"{live.url}/taxiway/runs/{DAG}/{quote(good_id, safe='')}")
    expect(page.get_by_role("heading", name="Loss")).to_be_visible()
    expect(page.locator("figure svg polyline")).to_have_count(1)
    expect(page.get_by_role("heading", name="Status history")).to_be_visible()
    page.screenshot(path=shots / "run-page.png", full_page=True)

    # the trigger form
    page.goto(f"{live.url}/dags/{DAG}")
    page.get_by_role("button", name="Trigger").first.click()
    dialog = page.get_by_role("dialog")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text("Trigger")
    page.screenshot(path=shots / "trigger-form.png")

    # the register task's extra links (its Details tab); same-origin links open in the same tab
    page.goto(f"{live.url}/dags/{DAG}/runs/{quote(good_id, safe='')}/tasks/register.model_version/details")
    for name in ("Model version", "MLflow run", "Eval report"):
        expect(page.get_by_role("link", name=name)).to_be_visible()
    href = page.get_by_role("link", name="Model version").get_attribute("href")
    assert href and href.endswith(f"/taxiway/go/model-version/{DAG}/{quote(good_id, safe='')}"), href
    page.screenshot(path=shots / "task-extra-links.png")
    page.get_by_role("link", name="Eval report").click()
    expect(page.get_by_role("heading", name=f"Evaluation of {good_id}")).to_be_visible()
    expect(page.locator("img[alt='per-unit comparison']")).to_be_visible()
    page.screenshot(path=shots / "eval-report.png", full_page=True)

    # a failed run's note says where, why and what next, in the run's own page of the grid
    page.goto(f"{live.url}/dags/{DAG}/runs/{quote(bad_id, safe='')}")
    expect(page.get_by_text("Failed at resolve_config").first).to_be_visible()
    expect(page.get_by_text("is outside the data roots").first).to_be_visible()
    expect(page.get_by_text("Upstream Failed").first).to_be_visible()  # the task table has loaded
    page.screenshot(path=shots / "failure-note.png")


def test_a_quarantined_batch_released_in_the_browser(live_airflow, browser, shots: Path, tmp_path: Path, monkeypatch):
    """The batches page, reached from the runs page's header, and a quarantined batch released with its
    form, as the admin. It is served by an api-server of its own beside the shared deployment's (same
    metadata database and users, its own ``TAXIWAY_HOME``): a landing zone, its registry and the refresh
    state are a deployment's, and the shared deployment's belong to the live refresh test."""
    from live_airflow import LiveAirflow
    from playwright.sync_api import expect

    from conftest import TINY
    from pipelines.refresh import attempts

    own = LiveAirflow(tmp_path / "batches", metadata_uri=live_airflow.init["metadata_uri"],
                      extra_env={"TAXIWAY_CONFIG": str(TINY)}, secrets_=live_airflow.init["secrets"])
    own.home.mkdir(parents=True)
    (own.home / "passwords.json").write_text(json.dumps({user: own.password for user in USERS}))
    own.launch("api-server")  # starts while the batches land
    try:
        bad, champion = _landing_zone(own.taxiway_home, tmp_path, monkeypatch)
        wait_for("the batches' api-server", own._healthy, 120, every_s=0.5)
        context = browser.new_context(viewport={"width": 1440, "height": 900})
        # signed in as the login page leaves a browser (the login itself: the test above)
        context.add_cookies([{"name": "_token", "value": own.token(), "url": own.url}])
        page = context.new_page()
        page.set_default_timeout(60_000)
        page.goto(f"{own.url}/taxiway/runs")
        page.get_by_role("link", name="Landed batches →").click()
        row = page.locator("tr[data-batch-id='2026-12-03-logs']")
        expect(row).to_contain_text("quarantined")
        expect(row).to_contain_text("last: failed at train: loss became NaN at step 12")
        expect(page.locator("tr[data-batch-id='2026-12-01-docs']")).to_contain_text(champion)
        expect(page.locator("tr[data-batch-id='2026-12-02-docs-again']")).to_contain_text("re-sent")
        expect(page.locator("tr[data-batch-id='2026-12-04-export']")).to_contain_text("invalid")
        page.screenshot(path=shots / "batches.png", full_page=True)

        row.get_by_role("button", name="Release").click()
        expect(page.get_by_text("Released batch 2026-12-03-logs: 3 failed attempt(s)")).to_be_visible()
        row = page.locator("tr[data-batch-id='2026-12-03-logs']")
        expect(row).to_contain_text("new")
        expect(row).to_contain_text("released by admin at")
        context.close()
    finally:
        own.stop()
    (record,) = attempts.released([bad])[bad.id]
    assert record["by"] == "admin" and len(record["attempts"]) == 3
    assert attempts.take([bad], "scheduled__2026-12-06T03:00:00+00:00", champion, 3).kept == [bad]


def _landing_zone(home: Path, tmp_path: Path, monkeypatch) -> tuple:
    """A landing zone with a batch in each state, and its champion (``TAXIWAY_HOME`` = ``home``: the
    registry on SQLite there, the refresh state); the quarantined batch and the champion are returned."""
    from test_batches import champion_with_ledger, land_by_hand, land_texts

    from pipelines.refresh import attempts
    from pipelines.run_folder import RunFolder, run_dir
    from trainer import fsio

    monkeypatch.setenv("TAXIWAY_HOME", str(home))
    home.mkdir(parents=True)
    trained = land_texts(home, tmp_path / "s1", "2026-12-01-docs", {"a.txt": "first document\n", "b.txt": "two\n"})
    champion = champion_with_ledger(tmp_path, [trained])
    land_texts(home, tmp_path / "s2", "2026-12-02-docs-again", {"a.txt": "first document\n", "b.txt": "two\n"})
    bad = land_texts(home, tmp_path / "s3", "2026-12-03-logs", {"log.txt": "keeps failing\n"})
    runs = [f"scheduled__2026-12-0{day}T03:00:00+00:00" for day in (3, 4, 5)]
    for run in runs:
        attempts.take([bad], run, champion, 3)
    fsio.write_json(RunFolder(run_dir("taxiway_refresh", runs[-1])).failure_summary, {
        "stage": "train", "task_id": "train.gang", "reason": "loss became NaN at step 12", "next": "fix the batch"})
    land_by_hand(home, "2026-12-04-export", {"train/export.py": b"print('not a document')\n"})
    land_texts(home, tmp_path / "s5", "2026-12-05-new", {"c.txt": "a new document\n"})
    return bad, champion
