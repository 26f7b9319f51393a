"""``registry.approval: required`` on a live Airflow: a candidate that passes its gate waits in the
human-in-the-loop task ``register.approval`` (state ``awaiting_input``: no worker or triggerer slot)
until a person answers — in the UI's *Required actions* (approve, in a real browser) or over REST
(reject, with a comment) — or the scheduler's timeout sweep answers *Reject* for no one (timed out).
Only the approval moves ``champion``; who, when and the comment are tags on the version. An approval
waiting past ``registry.approval_reminder_s`` is alerted to a local webhook receiver.

Separation of duties, played by a user with only the ``user`` role (tom): Airflow refuses his answer (he
is not one of ``registry.approvers``); the answer of the user who triggered a run, though an approver (admin,
by the role ``role:admin``), is refused by the decision, in the run's own folder. That version stays pending.
(A forged ``return_value`` on a task marked success by hand, and ``resolve_config``'s XCom rewritten to another
run's folder: test_registry.py, on the decision task's own callable, where they cost no training run.)

Two tests of two runs each, each run on one node: a gang's nodes are not what they are about, and the
runs of a test train side by side on two cores."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from live_airflow import settings, wait_for

from conftest import sign_in
from pipelines.run_folder import run_dir

DAG = "taxiway_train"
HOOK = "approval_hook"  # the alert connection, made over REST
REMIND_S = 5    # registry.approval_reminder_s
TIMEOUT_S = 20  # registry.approval_timeout_s of the timeout run's deployment config (the others': an hour)
pytestmark = [pytest.mark.live, pytest.mark.browser]


class Hook(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 (http.server's name)
        self.server.posts.append(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def hook(live_airflow) -> Iterator[ThreadingHTTPServer]:
    """A local webhook endpoint, the live deployment's connection ``HOOK``; what it was sent is in ``.posts``."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    server.posts = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    made = live_airflow.api.post("/api/v2/connections", json={
        "connection_id": HOOK, "conn_type": "http", "host": "127.0.0.1", "port": server.server_port,
        "schema": "http", "extra": json.dumps({"endpoint": "/hooks/approval"})})
    assert made.status_code == 201, made.text
    yield server
    server.shutdown()


def hitl(run_id: str) -> str:
    """The REST resource of a run's approval request."""
    return f"/api/v2/dags/{DAG}/dagRuns/{quote(run_id, safe='')}/taskInstances/register.approval/-1/hitlDetails"


def trigger(live, model: str, seed: int, timeout_s: int = 3600) -> str:
    """A one-node run of ``model`` whose registration needs an approval (ada's, or an admin's)."""
    made = live.trigger(DAG, {**settings(f"registry:\n  model_name: {model}\n  approval: required\n"
                                         f"  approval_timeout_s: {timeout_s}\n  approval_reminder_s: {REMIND_S}\n"
                                         f"  approvers: [ada, \"role:admin\"]\nalerts:\n  webhooks: [{HOOK}]\n"),
                              "train": {"seed": seed}, "compute": {"nodes": 1}})
    assert made.status_code == 200, made.text
    return made.json()["dag_run_id"]


def wait_awaiting(live, runs: dict[str, str], *decisions: str) -> None:
    """Until each run's approval waits, and the scheduler has seen the processes that parked the approval
    and its reminder end: an answer before then can fail the resumed approval as "killed externally"
    (Airflow 3.3.2's race, apache/airflow#72716: docs/evaluation.md), which is not what these tests are about."""
    def awaiting(run_id: str) -> bool:
        state = live.task_instances(DAG, run_id).get("register.approval", {}).get("state")
        assert state in (None, "scheduled", "queued", "running", "awaiting_input"), state
        return state == "awaiting_input"

    def parked(run_id: str) -> bool:
        return (live.process_exit_seen(DAG, run_id, "register.approval", "awaiting_input")
                and live.process_exit_seen(DAG, run_id, "register.approval_reminder", "deferred"))

    for decision in decisions:
        wait_for(f"the {decision} run to wait for approval", lambda d=decision: awaiting(runs[d]), 240, every_s=2)
        wait_for(f"the scheduler to see the {decision} run's approval park", lambda d=decision: parked(runs[d]), 60,
                 every_s=0.5)


def explain(live, run_id: str) -> str:
    """The states of a run's ``register`` tasks, the scheduler's "state mismatch" events for the run (a task it
    failed as killed externally, on an executor event for a finished process), and its approval's log: why
    its decision ended as it did."""
    states = {k: ti["state"] for k, ti in live.task_instances(DAG, run_id).items() if k.startswith("register.")}
    mismatches = [e.get("extra") for e in live.api.get("/api/v2/eventLogs", params={
        "dag_id": DAG, "run_id": run_id, "event": "state mismatch"}).json().get("event_logs", [])]
    return (f"{states}\nstate mismatch events: {mismatches}\n"
            f"register.approval's log:\n{(live.task_log(DAG, run_id, 'register.approval') or '')[-4000:]}")


def versions(c: Any, model: str, runs: dict[str, str]) -> dict[str, Any]:
    return {d: c.search_model_versions(f"name='{model}' and tag.`airflow.run_id`='{r}'")[0] for d, r in runs.items()}


def test_an_approval_in_the_browser_moves_the_champion_and_a_rejection_over_rest_does_not(
        live_airflow, hook, browser, shots: Path, monkeypatch):
    live, model = live_airflow, "live-approval"
    live.as_deployment(monkeypatch)  # the live deployment's registry
    runs = {"approve": trigger(live, model, 1), "reject": trigger(live, model, 2)}
    wait_awaiting(live, runs, "approve", "reject")

    from pipelines.registry import client

    c = client()
    assert "champion" not in c.get_registered_model(model).aliases, "no champion while approvals wait"
    listed = {a["run_id"] for a in live.api.get("/taxiway/api/approvals").json()}  # the Training runs view's list
    assert set(runs.values()) <= listed, listed

    # reject over REST, with a comment, as ada (an approver)
    answered = live.client("ada").patch(hitl(runs["reject"]), json={"chosen_options": ["Reject"],
                                                                    "params_input": {"comment": "overfits"}})
    assert answered.status_code == 200, answered.text

    # approve in the browser, from the task's Required actions page
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    page.set_default_timeout(60_000)
    try:
        from playwright.sync_api import expect

        sign_in(page, live.url, live.password, "ada")
        page.goto(f"{live.url}/dags/{DAG}/runs/{quote(runs['approve'], safe='')}/tasks/register.approval/"
                  "required_actions")
        expect(page.get_by_text(f"Approve {model} version").first).to_be_visible()
        expect(page.get_by_text("passed its gate and waits for your approval").first).to_be_visible()
        page.screenshot(path=shots / "approval-waiting.png", full_page=True)
        page.get_by_role("textbox").first.fill("looks right")
        page.get_by_role("button", name="Approve").click()
        wait_for("the UI's answer to reach Airflow", lambda: live.api.get(hitl(runs["approve"])).json()[
            "response_received"], 60, every_s=1)
    except Exception:
        page.screenshot(path=shots / "approval-at-failure.png", full_page=True)
        raise

    ended = {d: live.wait_run(DAG, r, timeout_s=240)["state"] for d, r in runs.items()}
    assert ended == {"approve": "success", "reject": "success"}, ended
    tis = {d: live.task_instances(DAG, r) for d, r in runs.items()}
    assert {d: ti["register.decision"]["state"] for d, ti in tis.items()} == {"approve": "success", "reject": "success"}
    # each reminder ended with its approval, due or not; the approve run waited for the browser far past REMIND_S
    assert {ti["register.approval_reminder"]["state"] for ti in tis.values()} == {"success"}
    reminded = {json.loads(body)["run_id"] for body in hook.posts if json.loads(body)["event"] == "approval_waiting"}
    assert runs["approve"] in reminded, hook.posts

    tags = {d: mv.tags for d, mv in versions(c, model, runs).items()}
    assert c.get_model_version_by_alias(model, "champion").version == versions(c, model, runs)["approve"].version
    assert tags["approve"]["taxiway.approval"] == "approved" and tags["approve"]["taxiway.approval.by"] == "ada"
    assert tags["approve"]["taxiway.approval.comment"] == "looks right"
    assert (tags["reject"]["taxiway.approval"], tags["reject"]["taxiway.approval.comment"]) == ("rejected", "overfits")


def test_an_approval_is_refused_to_a_non_approver_and_to_the_triggering_user_and_times_out(live_airflow, hook,
                                                                                             monkeypatch):
    live, model = live_airflow, "live-approval-duties"
    live.as_deployment(monkeypatch)
    runs = {"timeout": trigger(live, model, 3, timeout_s=TIMEOUT_S), "self": trigger(live, model, 4)}
    wait_awaiting(live, runs, "self")

    own = run_dir(DAG, runs["self"], live.taxiway_home)
    tom = live.client("tom")  # may edit XComs and task states, approves nothing
    assert tom.patch(hitl(runs["self"]), json={"chosen_options": ["Approve"]}).status_code == 403  # not an approver
    # admin triggered the run and is one of registry.approvers: Airflow takes the answer, the decision refuses it
    assert live.api.patch(hitl(runs["self"]), json={"chosen_options": ["Approve"]}).status_code == 200

    ended = {d: live.wait_run(DAG, r, timeout_s=240)["state"] for d, r in runs.items()}
    decided = {d: live.task_instances(DAG, r)["register.decision"]["state"] for d, r in runs.items()}
    assert (ended, decided) == ({"timeout": "success", "self": "failed"},) * 2, f"{ended}\n{explain(live, runs['self'])}"
    log = live.task_log(DAG, runs["self"], "register.decision", 1) or ""
    assert "user 'admin' triggered this run, and may not answer its own approval" in log, log[-2000:]
    record = json.loads((own / "registry.json").read_text())
    assert (record["approval"], record["approval_refused"]["by"]) == ("pending", "admin"), record

    from pipelines.registry import client

    c = client()
    tags = {d: mv.tags for d, mv in versions(c, model, runs).items()}
    assert tags["timeout"]["taxiway.approval"] == "timed_out" and tags["timeout"]["taxiway.approval.by"] == "(timeout)"
    assert f"registry.approval_timeout_s ({TIMEOUT_S} s)" in tags["timeout"]["taxiway.alias_reason"]
    assert tags["self"]["taxiway.approval"] == "pending" and "taxiway.approval.by" not in tags["self"]
    assert "champion" not in c.get_registered_model(model).aliases
