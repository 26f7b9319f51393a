"""Refuses, in the api-server, a trigger, backfill or asset materialization of a Taxiway DAG whose ``conf``
the run could not take, before the run exists: 400 naming each key path (never the value). Two kinds:
a number a task could never receive (Airflow stores a run's conf as sent, PostgreSQL's jsonb keeps any
integer, and msgpack, which sends it to each task, stops at 64 bits: every task of such a run would fail
before it starts, with an empty log), and what ``intake`` refuses (unknown keys, fields only the
deployment sets, bounds, limits), as the first task would. This ASGI middleware reads the body first;
any other request passes untouched."""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from taxiway_airflow import intake
from taxiway_airflow.conf_numbers import bad_numbers

log = logging.getLogger(__name__)

TAXIWAY_DAGS = ("taxiway_train", "taxiway_refresh", "taxiway_land", "taxiway_sweep")
# every route that creates a run with a conf, under any prefix ([api] base_url on a sub-path)
_PREFIX = r"^(?:/[^?#]*)?"
TRIGGER = re.compile(_PREFIX + r"/api/v2/dags/(?P<dag>[^/]+)/dagRuns/?$")      # body: {"conf": {...}}
BACKFILL = re.compile(_PREFIX + r"/api/v2/backfills(/dry_run)?/?$")             # {"dag_id", "dag_run_conf"}
# a run of the asset's producing DAG, whichever it is (the route names the asset by id): every conf is checked
MATERIALIZE = re.compile(_PREFIX + r"/api/v2/assets/[^/]+/materialize/?$")      # body: {"conf": {...}}
MAX_NAMED = 20  # keys named in one refusal: the answer stays short whatever the trigger sent
MAX_BODY = 1 << 20  # a Taxiway conf is at most 64 KiB (params.MAX_CONF_BYTES): a body past 1 MiB is refused unread


class TriggerConfGuard:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope.get("path", "") if scope["type"] == "http" and scope["method"] == "POST" else ""
        trigger = TRIGGER.match(path)
        materialize = MATERIALIZE.match(path) is not None
        guarded = (trigger["dag"] in TAXIWAY_DAGS if trigger else materialize or BACKFILL.match(path) is not None)
        if not guarded:
            return await self.app(scope, receive, send)
        body, more = b"", True
        while more and len(body) <= MAX_BODY:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        if len(body) > MAX_BODY:
            return await _refuse(send, 413, f"request body larger than {MAX_BODY >> 20} MiB; a conf is at most 64 KiB")
        if problems := _conf_problems(body, trigger["dag"] if trigger else None, materialize):
            named = "; ".join(f"{path}: {why}" for path, why in problems[:MAX_NAMED])
            more = f"; and {len(problems) - MAX_NAMED} more" if len(problems) > MAX_NAMED else ""
            return await _refuse(send, 400, f"conf: {named}{more}")
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": more}

        await self.app(scope, replay, send)


async def _refuse(send: Any, status: int, detail: str) -> None:
    payload = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})


def _conf_problems(body: bytes, dag_from_path: str | None, materialize: bool) -> list[tuple[str, str]]:
    """(key path, reason) of what a Taxiway trigger's conf (``conf``; a backfill's ``dag_run_conf``, its
    DAG in the body) cannot hold: a number a task could not receive, and, where the DAG is known, all that
    ``intake`` refuses (unknown keys, owned fields, bounds, limits). A materialization names its asset,
    not its DAG: its numbers alone, and its first task checks the rest. A body that is no JSON object
    is Airflow's to refuse."""
    try:
        doc = json.loads(body)
    except ValueError:
        return []
    if not isinstance(doc, dict):
        return []
    dag = dag_from_path or (None if materialize else doc.get("dag_id"))
    if not materialize and dag not in TAXIWAY_DAGS:
        return []
    conf = doc.get("dag_run_conf" if dag_from_path is None and not materialize else "conf")
    if not isinstance(conf, dict):
        return []
    numbers = [problem for key, value in conf.items() for problem in bad_numbers(value, str(key)[:80])]
    if numbers or dag is None:
        return numbers
    try:
        return intake.refusals(dag, conf)
    except Exception as exc:  # the deployment's own config unreadable here: the first task says why
        log.warning("conf not checked before the run: %s", type(exc).__name__)
        return []
