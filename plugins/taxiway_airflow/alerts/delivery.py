"""Sending one alert through every connection of ``alerts``: a mail through each SMTP connection, a
JSON POST to each webhook, side by side (so a slow one does not hold back the rest), one try each,
each reply awaited at most ``alerts.timeout_s``. An alert is a courtesy beside the event it reports: a connection that is missing,
down or refuses is logged (its id and the kind of failure, never its address or a reply's text) and
never fails the task or callback that sent it.

Connections are read as the SMTP and HTTP providers read them, so a deployment's ``smtp_default`` works
unchanged: SMTP over SSL unless the extra says ``disable_ssl``, then STARTTLS unless ``disable_tls``.
"""

from __future__ import annotations

import json
import logging
import smtplib
import ssl
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from email.message import EmailMessage
from typing import Any

from airflow.sdk import Connection
from airflow.sdk.exceptions import AirflowNotFoundException

from pipelines.config.alerts import AlertsConfig
from taxiway_airflow.alerts.alert import Alert

log = logging.getLogger("taxiway")

MAIL_TYPES, WEBHOOK_TYPES = ("smtp", "email"), ("http", "https")


class Undeliverable(Exception):
    """A connection that cannot carry an alert as configured; the message names fields, never values."""


def _flag(value: Any) -> bool:
    """An extra's boolean, as JSON gives it or as a connection URI's query string does ("true")."""
    return value is True or str(value).strip().lower() in ("true", "1", "yes")


def _listed(value: Any) -> list[str]:
    if isinstance(value, str):
        return [a.strip() for a in value.replace(";", ",").split(",") if a.strip()]
    return [str(a) for a in value] if isinstance(value, list) else []


def _connection(conn_id: str, kinds: tuple[str, ...]) -> Any:
    conn = Connection.get(conn_id)
    if conn.conn_type not in kinds:
        raise Undeliverable(f"its type is {conn.conn_type!r}, not one of {', '.join(kinds)}")
    if not conn.host:
        raise Undeliverable("it has no host")
    return conn


def send_mail(conn: Any, alert: Alert, cfg: AlertsConfig) -> None:
    extra = conn.extra_dejson
    recipients = list(dict.fromkeys([*cfg.email_to, *_listed(extra.get("to"))]))
    sender = extra.get("from_email") or conn.login
    if not recipients:
        raise Undeliverable("no recipients: set alerts.email_to or the connection's extra 'to'")
    if not sender:
        raise Undeliverable("no sender: set the connection's extra 'from_email' (or its login)")
    msg = EmailMessage()
    msg["Subject"], msg["From"], msg["To"] = alert.subject(), sender, ", ".join(recipients)
    msg.set_content(alert.body())
    use_ssl, use_tls = not _flag(extra.get("disable_ssl")), not _flag(extra.get("disable_tls"))
    port = conn.port or (465 if use_ssl else 587 if use_tls else 25)
    context = ssl.create_default_context()
    server = (smtplib.SMTP_SSL(conn.host, port, timeout=cfg.timeout_s, context=context) if use_ssl
              else smtplib.SMTP(conn.host, port, timeout=cfg.timeout_s))
    with server:
        if not use_ssl and use_tls:
            server.starttls(context=context)
        if conn.login and conn.password:
            server.login(conn.login, conn.password)
        server.send_message(msg)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is a failure: following it would send the alert (and its Authorization) elsewhere."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def webhook_url(conn: Any) -> str:
    """``schema://host[:port]/endpoint`` (or the host itself when it is a URL) + the extra's ``endpoint``."""
    base = conn.host if "://" in conn.host else (
        f"{conn.schema or 'https'}://{conn.host}" + (f":{conn.port}" if conn.port else ""))
    if not base.startswith(("http://", "https://")):
        raise Undeliverable("its scheme is not http or https")
    endpoint = str(conn.extra_dejson.get("endpoint") or "")
    return base.rstrip("/") + ("/" + endpoint.lstrip("/") if endpoint else "")


def post_json(conn: Any, alert: Alert, cfg: AlertsConfig) -> None:
    headers = {"Content-Type": "application/json", "User-Agent": "taxiway-alerts"}
    if conn.password:
        headers["Authorization"] = conn.password
    request = urllib.request.Request(webhook_url(conn), json.dumps(alert.to_json()).encode(), headers,
                                     method="POST")
    with urllib.request.build_opener(_NoRedirect).open(request, timeout=cfg.timeout_s) as answer:
        answer.read(4096)  # any 2xx; urllib raises HTTPError on the rest


def why(exc: BaseException) -> str:
    """The kind of failure, in words that hold no address, credential or text of a server's reply."""
    if isinstance(exc, Undeliverable):
        return str(exc)
    if isinstance(exc, AirflowNotFoundException):
        return "no such connection"
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code}"
    if isinstance(exc, urllib.error.URLError) and isinstance(exc.reason, BaseException):
        return why(exc.reason)
    if isinstance(exc, smtplib.SMTPResponseException):
        return f"SMTP {exc.smtp_code}"
    if isinstance(exc, ssl.SSLError):  # its text may name the server (a certificate's host)
        return f"{type(exc).__name__} ({exc.reason or 'TLS failure'})"
    if isinstance(exc, OSError) and exc.strerror:
        return f"{type(exc).__name__} ({exc.strerror})"
    return type(exc).__name__


def deliver(alert: Alert, cfg: AlertsConfig) -> list[str]:
    """Send ``alert`` through every connection of ``cfg``; returns the ids it reached. Connections are
    looked up first, in this thread (a task's lookups go through its supervisor one at a time), then
    each is sent to in a thread of its own."""
    targets = [(c, MAIL_TYPES, send_mail) for c in cfg.email] + [(c, WEBHOOK_TYPES, post_json) for c in cfg.webhooks]
    if not targets:
        return []
    outcomes: list[tuple[str, Any]] = []  # (connection id, a Future or the exception of its lookup)
    with ThreadPoolExecutor(max_workers=len(targets), thread_name_prefix="taxiway-alert") as pool:
        for conn_id, kinds, send in targets:
            try:
                outcomes.append((conn_id, pool.submit(send, _connection(conn_id, kinds), alert, cfg)))
            except Exception as exc:
                outcomes.append((conn_id, exc))
        reached = []
        for conn_id, outcome in outcomes:
            try:
                if isinstance(outcome, BaseException):
                    raise outcome
                outcome.result()
            except Exception as exc:  # an alert must never fail what it reports on
                log.warning("alert %s not delivered through connection %s: %s", alert.event, conn_id, why(exc))
            else:
                reached.append(conn_id)
    log.info("alert %s (%s) sent through %s", alert.event, alert.summary,
             ", ".join(reached) if reached else "no connection")
    return reached
