"""``registry.approval: required`` on a live Airflow: a candidate that passes its gate waits in the
human-in-the-loop task ``register.approval`` (state ``awaiting_input``: no worker or triggerer slot)
until a person answers — in the UI's *Required actions* (approve, in a real browser) or over REST
(reject, with a comment) — or the scheduler's timeout sweep answers *Reject* for no one (timed out).
Only the approval moves ``champion``; who, when and the comment are tags on the version. An approval
waiting past ``registry.approval_reminder_s`` is alerted to a local webhook receiver.

Separation of duties, played by a user with only the ``user`` role (tom): Airflow refuses his answer (he
is not one of ``registry.approvers``); a forged approval (his ``return_value`` XCom on the approval task,
the task marked success) and his rewrite of ``resolve_config``'s XCom to another run's folder decide
nothing (the decision reads its own folder and finds no answer there); and the answer of the user who
triggered a run, though an approver (admin, by the role ``role:admin``), is refused by the decision. Those versions stay pending."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote

import pytest
from live_airflow import settings, wait_for

from conftest import sign_in
from pipelines.run_folder import run_dir

DAG = "taxiway_train"
MODEL = "live-approval"
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


def webhook_receiver() -> ThreadingHTTPServer:
    """A local webhook endpoint; what it was sent is in ``.posts``."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    server.posts = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def hitl(run_id: str) -> str:
    """The REST resource of a run's approval request."""
    return f"/api/v2/dags/{DAG}/dagRuns/{quote(run_id, safe='')}/taskInstances/register.approval/-1/hitlDetails"


def test_a_promotion_waits_for_a_person_approve_reject_or_timeout(live_airflow, browser, shots: Path, monkeypatch):
    live = live_airflow
    live.as_deployment(monkeypatch)  # the live deployment's registry
    hook = webhook_receiver()
    made = live.api.post("/api/v2/connections", json={
        "connection_id": HOOK, "conn_type": "http", "host": "127.0.0.1", "port": hook.server_port, "schema": "http",
        "extra": json.dumps({"endpoint": "/hooks/approval"})})
    assert made.status_code in (201, 409), made.text
    policy = {timeout: settings(f"registry:\n  model_name: {MODEL}\n  approval: required\n"
                                f"  approval_timeout_s: {timeout}\n  approval_reminder_s: {REMIND_S}\n"
                                f"  approvers: [ada, \"role:admin\"]\nalerts:\n  webhooks: [{HOOK}]\n")
              for timeout in (TIMEOUT_S, 3600)}
    runs = {}
    for decision, seed in (("approve", 1), ("reject", 2), ("timeout", 3), ("forged", 4), ("self", 5)):
        # one node each: five gangs at once on two cores, and a gang's nodes are not what this test is about
        made = live.trigger(DAG, {**policy[TIMEOUT_S if decision == "timeout" else 3600], "train": {"seed": seed},
                                  "compute": {"nodes": 1}})
        assert made.status_code == 200, made.text
        runs[decision] = made.json()["dag_run_id"]

    def awaiting(run_id: str) -> bool:
        state = live.task_instances(DAG, run_id).get("register.approval", {}).get("state")
        assert state in (None, "scheduled", "queued", "running", "awaiting_input"), state
        return state == "awaiting_input"

    for decision in ("approve", "reject", "forged", "self"):
        wait_for(f"the {decision} run to wait for approval", lambda d=decision: awaiting(runs[d]), 300, every_s=2)

    from pipelines.registry import client

    c = client()
    assert "champion" not in c.get_registered_model(MODEL).aliases, "no champion while approvals wait"  # (the timeout run may be challenger by now)
    listed = {a["run_id"] for a in live.api.get("/taxiway/api/approvals").json()}  # the Training runs view's list
    assert {runs["approve"], runs["reject"]} <= listed, listed

    # reject over REST, with a comment, as ada (an approver)
    ada, tom = live.client("ada"), live.client("tom")
    answered = ada.patch(hitl(runs["reject"]), json={"chosen_options": ["Reject"], "params_input": {"comment": "overfits"}})
    assert answered.status_code == 200, answered.text

    # approve in the browser, from the task's Required actions page
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    page.set_default_timeout(60_000)
    try:
        from playwright.sync_api import expect

        sign_in(page, live.url, live.password, "ada")
        page.goto(f"{live.url}/dags/{DAG}/runs/{quote(runs['approve'], safe='')}/tasks/register.approval/"
                  "required_actions")
        expect(page.get_by_text(f"Approve {MODEL} version").first).to_be_visible()
        expect(page.get_by_text("passed its gate and waits for your approval").first).to_be_visible()
        page.screenshot(path=shots / "approval-waiting.png", full_page=True)
        page.get_by_role("textbox").first.fill("looks right")
        page.get_by_role("button", name="Approve").click()
        wait_for("the UI's answer to reach Airflow", lambda: live.api.get(hitl(runs["approve"])).json()[
            "response_received"], 60, every_s=1)
    except Exception:
        page.screenshot(path=shots / "approval-at-failure.png", full_page=True)
        raise

    _forged(live, tom, runs["forged"], other=runs["approve"])
    # admin triggered the run "self" and is one of registry.approvers: Airflow takes the answer, the decision refuses it
    assert live.api.patch(hitl(runs["self"]), json={"chosen_options": ["Approve"]}).status_code == 200
    assert _decided(live, runs["self"], "the triggering user's approval") == "failed"
    log = live.task_log(DAG, runs["self"], "register.decision", 1) or ""
    assert "user 'admin' triggered this run, and may not answer its own approval" in log, log[-2000:]

    ended = {d: live.wait_run(DAG, r, timeout_s=240)["state"] for d, r in runs.items()}
    assert ended == {"approve": "success", "reject": "success", "timeout": "success", "forged": "failed",
                     "self": "failed"}, ended
    decided = {d: live.task_instances(DAG, r)["register.decision"]["state"] for d, r in runs.items()}
    assert decided == {"approve": "success", "reject": "success", "timeout": "success", "forged": "failed",
                       "self": "failed"}, decided

    reminded = {json.loads(body)["run_id"] for body in hook.posts if json.loads(body)["event"] == "approval_waiting"}
    assert runs["approve"] in reminded, hook.posts  # it waited for the browser far longer than REMIND_S
    reminders = {d: live.task_instances(DAG, r)["register.approval_reminder"]["state"] for d, r in runs.items()}
    assert set(reminders.values()) == {"success"}, reminders  # each ended with its approval, due or not

    versions = {d: c.search_model_versions(f"name='{MODEL}' and tag.`airflow.run_id`='{r}'")[0]
                for d, r in runs.items()}
    tags = {d: mv.tags for d, mv in versions.items()}
    champion = c.get_model_version_by_alias(MODEL, "champion")
    assert champion.version == versions["approve"].version
    assert tags["approve"]["taxiway.approval"] == "approved" and tags["approve"]["taxiway.approval.by"] == "ada"
    assert tags["approve"]["taxiway.approval.comment"] == "looks right"
    assert (tags["reject"]["taxiway.approval"], tags["reject"]["taxiway.approval.comment"]) == ("rejected", "overfits")
    assert tags["timeout"]["taxiway.approval"] == "timed_out" and tags["timeout"]["taxiway.approval.by"] == "(timeout)"
    assert f"registry.approval_timeout_s ({TIMEOUT_S} s)" in tags["timeout"]["taxiway.alias_reason"]
    for refused in ("forged", "self"):
        assert tags[refused]["taxiway.approval"] == "pending" and "taxiway.approval.by" not in tags[refused]
    record = json.loads((run_dir(DAG, runs["self"], live.taxiway_home) / "registry.json").read_text())
    assert (record["approval"], record["approval_refused"]["by"]) == ("pending", "admin"), record


def _forged(live, tom, run_id: str, other: str) -> None:
    """tom, who may edit XComs and task states but approves nothing, tries each way round the approval of
    the run ``run_id``: answering (403), pointing ``resolve_config``'s XCom at the run ``other``'s folder,
    and a ``return_value`` XCom saying "approved" on the approval task, marked success."""
    own, elsewhere = run_dir(DAG, run_id, live.taxiway_home), run_dir(DAG, other, live.taxiway_home)
    assert tom.patch(hitl(run_id), json={"chosen_options": ["Approve"]}).status_code == 403  # not an approver
    ti = f"/api/v2/dags/{DAG}/dagRuns/{quote(run_id, safe='')}/taskInstances"
    moved = tom.patch(f"{ti}/resolve_config/xcomEntries/return_value", json={"value": {
        "run_dir": str(elsewhere), "config_sha256": "0" * 64, "name": "x"}})
    assert moved.status_code == 200, moved.text  # every later task reads another run's folder, if it trusted this
    forged = {"choice": "approved", "by": "ada", "by_id": "ada", "at": "2026-12-05T00:00:00+00:00", "comment": ""}
    assert tom.post(f"{ti}/register.approval/xcomEntries", json={"key": "return_value", "value": forged}).status_code == 201
    marked = tom.patch(f"{ti}/register.approval", json={"new_state": "success"})
    assert marked.status_code == 200, marked.text
    assert _decided(live, run_id, "the forged approval") == "failed"
    log = live.task_log(DAG, run_id, "register.decision", 1) or ""
    assert "recorded no answer" in log and own.name in log and elsewhere.name not in log, log[-2000:]


def _decided(live, run_id: str, what: str, try_number: int = 1) -> str:
    """The state ``register.decision`` ends in, on its ``try_number``-th try, after ``what``."""
    def ended() -> str | None:
        ti = live.task_instances(DAG, run_id).get("register.decision", {})
        done = ti.get("try_number") == try_number and ti.get("state") in ("success", "failed", "upstream_failed")
        return ti["state"] if done else None

    def explain() -> str:
        tis = live.task_instances(DAG, run_id)
        approval = live.task_log(DAG, run_id, "register.approval", try_number) or ""
        return (str({k: (ti["state"], ti["try_number"]) for k, ti in tis.items() if k.startswith("register.")})
                + f"\nregister.approval's log:\n{approval[-4000:]}")

    return wait_for(f"the decision on {what}", ended, 120, every_s=2, explain=explain)
