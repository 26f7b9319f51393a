"""Alerts (docs/alerts.md) received by real local servers: an SMTP server (aiosmtpd, with a login) and
a webhook receiver (http.server), reached through Airflow connections given the way a deployment's
Secret backend gives them (here ``AIRFLOW_CONN_*``). Each event is proven once where it is cheapest:
a failed refresh with ``dag.test()`` (the DAG's callbacks are the wiring), the plan's alerts on the
real refresh plan (a champion registered without training), the approval reminder directly."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email import message_from_bytes, policy
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote

import pytest
from live_airflow import free_port

from conftest import REPO, deployment_config

PASSWORD, TOKEN = "smtp-pass-5f1c", "Bearer hook-token-9a2e"  # placeholders: must never appear in an alert
MAIL_CONN, HOOK_CONN = "alerts_mail", "alerts_hook"
ALERTS = (f"alerts:\n  email: [{MAIL_CONN}]\n  email_to: [ops@example.org]\n  webhooks: [{HOOK_CONN}]\n"
          "  timeout_s: 5\n")


@dataclass
class Received:
    mails: list[tuple[str, list[str], bytes]] = field(default_factory=list)  # (from, to, message)
    logins: list[tuple[bytes, bytes]] = field(default_factory=list)
    posts: list[tuple[str, dict[str, str], bytes]] = field(default_factory=list)  # (path, headers, body)
    status: int = 200  # what the webhook answers


@pytest.fixture
def received(monkeypatch: pytest.MonkeyPatch) -> Iterator[Received]:
    """Both servers on free loopback ports, and the two connections that name them."""
    from aiosmtpd.controller import Controller
    from aiosmtpd.smtp import AuthResult

    got = Received()

    class Mailbox:
        async def handle_DATA(self, server, session, envelope):  # noqa: N802 (aiosmtpd's hook name)
            got.mails.append((envelope.mail_from, list(envelope.rcpt_tos), envelope.original_content))
            return "250 OK"

    def login(server, session, envelope, mechanism, data):
        got.logins.append((data.login, data.password))
        return AuthResult(success=data.password == PASSWORD.encode())

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers["Content-Length"]))
            got.posts.append((self.path, dict(self.headers), body))
            self.send_response(got.status)
            self.end_headers()

        def log_message(self, *args):
            pass

    smtp = Controller(Mailbox(), hostname="127.0.0.1", port=free_port(), authenticator=login, auth_require_tls=False)
    smtp.start()
    hook = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    monkeypatch.setenv(f"AIRFLOW_CONN_{MAIL_CONN.upper()}", json.dumps({
        "conn_type": "smtp", "host": "127.0.0.1", "port": smtp.port, "login": "taxiway", "password": PASSWORD,
        "extra": {"from_email": "taxiway@example.org", "to": "oncall@example.org", "disable_ssl": True,
                  "disable_tls": True}}))
    monkeypatch.setenv(f"AIRFLOW_CONN_{HOOK_CONN.upper()}", json.dumps({
        "conn_type": "http", "host": "127.0.0.1", "schema": "http", "port": hook.server_port, "password": TOKEN,
        "extra": {"endpoint": "/hooks/taxiway"}}))
    yield got
    hook.shutdown()
    hook.server_close()
    smtp.stop()


def _mail(raw: bytes):
    return message_from_bytes(raw, policy=policy.default)


def _one_alert(got: Received, event: str) -> tuple[object, dict]:
    """The one mail and the one webhook body of ``event``; checks what every alert holds and never holds."""
    mails = [m for m in got.mails if f"[taxiway] {event.replace('_', ' ')}" in _mail(m[2])["Subject"]]
    posts = [json.loads(p[2]) for p in got.posts if json.loads(p[2])["event"] == event]
    assert len(mails) == 1 and len(posts) == 1, (got.mails, got.posts)
    (sender, to, raw), body = mails[0], posts[0]
    assert sender == "taxiway@example.org" and sorted(to) == ["oncall@example.org", "ops@example.org"]
    assert got.logins and all(lg == (b"taxiway", PASSWORD.encode()) for lg in got.logins)
    hook = next(p for p in got.posts if json.loads(p[2])["event"] == event)
    assert hook[0] == "/hooks/taxiway" and hook[1]["Authorization"] == TOKEN
    assert hook[1]["Content-Type"] == "application/json"
    text = raw.decode() + json.dumps(body)
    assert PASSWORD not in text and TOKEN.split()[1] not in text
    assert body["link"].endswith(f"/taxiway/runs/{body['dag_id']}/{quote(body['run_id'], safe='')}")
    assert body["summary"] in _mail(raw).get_content() and body["link"] in _mail(raw).get_content()
    assert datetime.fromisoformat(body["at"]).tzinfo is not None
    return _mail(raw), body


def test_a_failed_refresh_is_mailed_and_posted_with_its_failure_summary(
        received: Received, airflow_db: Path, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The DAG's failure callbacks: the failure summary first, then the alert quoting it."""
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("TAXIWAY_CONFIG", deployment_config(tmp_path, monkeypatch, ALERTS))
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "https://airflow.example.org")  # the links' base
    dag = DagBag(dag_folder=str(REPO / "dags" / "taxiway_refresh.py")).dags["taxiway_refresh"]
    dr = dag.test(run_conf={"set": ["refresh.steps=5"]})  # only the deployment sets refresh.*: bad input at plan
    assert str(dr.state) == "failed"
    mail, body = _one_alert(received, "run_failed")
    assert (body["dag_id"], body["run_id"]) == ("taxiway_refresh", dr.run_id)
    assert body["link"].startswith("https://airflow.example.org/taxiway/runs/taxiway_refresh/manual__")
    assert body["summary"].startswith("taxiway_refresh failed at plan (plan, bad input): ")
    assert "refresh.steps" in body["summary"] and "=5" not in body["summary"]  # the key, never the trigger's value
    if sample := os.environ.get("TAXIWAY_SCREENSHOTS"):  # the received alert, for the docs (as the browser test's)
        Path(sample, "alert-received.txt").write_text(
            "# As received by the local SMTP server and the webhook receiver of tests/test_alerts.py\n\n"
            "## Mail (headers as received, body decoded)\n\n" + "".join(f"{k}: {v}\n" for k, v in mail.items())
            + f"\n{mail.get_content()}\n## Webhook POST body\n\n{json.dumps(body, indent=2)}\n")


def test_an_alert_that_cannot_be_delivered_is_logged_and_raises_nothing(
        received: Received, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture):
    from types import SimpleNamespace

    from taxiway_airflow.alerts.notifier import RunFailedNotifier

    monkeypatch.setenv("TAXIWAY_CONFIG", deployment_config(tmp_path, monkeypatch, ALERTS.replace(
        "webhooks: [", "webhooks: [missing_conn, ")))
    mail_conn = json.loads(os.environ[f"AIRFLOW_CONN_{MAIL_CONN.upper()}"])
    dead = free_port()  # nothing listens there
    monkeypatch.setenv(f"AIRFLOW_CONN_{MAIL_CONN.upper()}", json.dumps({**mail_conn, "port": dead}))
    received.status = 500
    context = {"dag": SimpleNamespace(dag_id="taxiway_refresh"), "run_id": "manual__x", "reason": "task_failure"}
    caplog.set_level("INFO", logger="taxiway")
    RunFailedNotifier()(context)  # as Airflow calls it; raises nothing
    assert not received.mails and len(received.posts) == 1
    out = capsys.readouterr()
    log = out.out + out.err + caplog.text  # where log lines land depends on what configured logging first
    assert f"alert run_failed not delivered through connection {MAIL_CONN}: ConnectionRefusedError " \
           "(Connection refused)" in log
    assert f"alert run_failed not delivered through connection {HOOK_CONN}: HTTP 500" in log
    assert "alert run_failed not delivered through connection missing_conn: no such connection" in log
    assert "alert run_failed (taxiway_refresh failed: task_failure) sent through no connection" in log
    lines = [line for line in log.splitlines() if "alert run_failed" in line]
    assert lines and not any(s in line for line in lines for s in ("127.0.0.1", str(dead), PASSWORD, TOKEN))


@pytest.fixture
def champion(home: Path) -> str:
    """A champion in this test's registry, registered without training: the plan only reads its ledger."""
    from pipelines.registry import client

    c = client()
    c.create_registered_model("taxiway-tiny-gpt")
    (home / "model").mkdir()
    mv = c.create_model_version("taxiway-tiny-gpt", str(home / "model"))
    c.set_registered_model_alias("taxiway-tiny-gpt", "champion", mv.version)
    return f"models:/taxiway-tiny-gpt/{mv.version}"


def _land(home: Path, tmp_path: Path, batch_id: str) -> None:
    from pipelines.refresh import landing

    src = tmp_path / "src" / batch_id / "train"
    src.mkdir(parents=True)
    for i in range(3):
        (src / f"doc{i}.txt").write_text(f"Document {i} of batch {batch_id}, new to the champion.\n")
    landing.land(src.parent, home / "landing", batch_id=batch_id)


def _plan_and_alert(config: str, home: Path, run_id: str, now: datetime | None = None) -> list[str]:
    """The plan task's two steps, as it runs them: the refresh's plan, then its alerts."""
    from pipelines.config import load_config
    from pipelines.stages import refresh
    from taxiway_airflow.alerts.refresh import after_plan

    cfg, run_dir = load_config(config), home / "runs" / run_id
    refresh.plan(cfg, run_dir, run_id)
    return [a.event for a in after_plan(cfg, run_dir, "taxiway_refresh", run_id, now)]


def test_a_newly_quarantined_batch_is_alerted_once(received: Received, champion: str, home: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch):
    config = deployment_config(tmp_path, monkeypatch, ALERTS + "refresh:\n  max_attempts: 1\n")
    _land(home, tmp_path, "b1")
    assert _plan_and_alert(config, home, "r1") == []  # b1 taken: its first attempt
    assert _plan_and_alert(config, home, "r2") == ["batch_quarantined"]  # r1 did not make it champion
    assert _plan_and_alert(config, home, "r3") == []  # still quarantined: said once
    _, body = _one_alert(received, "batch_quarantined")
    assert body["run_id"] == "r2" and body["summary"].startswith(
        f"batch b1 is quarantined: it took part in 1 failed refresh(es) of {champion}")


def test_a_stale_champion_is_alerted_once_per_max_age_while_batches_wait(
        received: Received, champion: str, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    config = deployment_config(tmp_path, monkeypatch, ALERTS + "refresh:\n  max_age_s: 86400\n  max_attempts: 10\n")
    assert _plan_and_alert(config, home, "r0", datetime.now(UTC) + timedelta(days=3)) == []  # nothing waits
    _land(home, tmp_path, "b1")
    now = datetime.now(UTC)
    assert _plan_and_alert(config, home, "r1", now + timedelta(hours=23)) == []  # not a day since b1 landed
    assert _plan_and_alert(config, home, "r2", now + timedelta(days=2)) == ["champion_stale"]
    assert _plan_and_alert(config, home, "r3", now + timedelta(days=2, hours=12)) == []  # same period
    _, body = _one_alert(received, "champion_stale")
    assert body["run_id"] == "r2" and f"champion {champion}" in body["summary"]
    assert "past refresh.max_age_s (24.0 h); 1 batch(es) wait: b1" in body["summary"]
    assert _plan_and_alert(config, home, "r4", now + timedelta(days=3, hours=1)) == ["champion_stale"]


def test_an_approval_waiting_past_its_reminder_is_alerted(received: Received, home: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch):
    from pipelines.config import load_config
    from taxiway_airflow.alerts.approval import approval_waiting

    alerts = load_config(deployment_config(tmp_path, monkeypatch, ALERTS)).alerts
    assert approval_waiting(alerts, "taxiway_train", "manual__1", "models:/m/4", 90000.0) == [MAIL_CONN, HOOK_CONN]
    _, body = _one_alert(received, "approval_waiting")
    assert body["summary"].startswith("models:/m/4 has waited 25.0 h for approval")


def test_alerts_name_connections_only():
    """The section holds connection ids and recipients: a URL or an address with a secret is refused."""
    from pydantic import ValidationError

    from pipelines.config.alerts import AlertsConfig

    AlertsConfig(email=["smtp_default"], webhooks=["alerts.chat-1"], email_to=["ops@example.org"])
    for bad in ({"webhooks": ["https://hooks.example.org/T0/B0/xyz"]}, {"email": ["user:pw@mail"]},
                {"email_to": ["Ops <ops@example.org>, x@y.z"]}, {"webhooks": [f"c{i}" for i in range(9)]}):
        with pytest.raises(ValidationError):
            AlertsConfig(**bad)
