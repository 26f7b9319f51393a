"""Refuses, in the api-server, a trigger, backfill or asset materialization of a Taxiway DAG whose ``conf`` holds a number a task could
never receive. Airflow stores a run's conf as sent (PostgreSQL's jsonb keeps any integer, and a whole
float as one) and sends it to each task with msgpack, which stops at 64 bits: every task of such a
run then fails before it starts, with an empty log. ``params.check_conf`` runs in the first task,
too late; the form's params bound their own fields but not keys Airflow takes without a param. This
ASGI middleware reads the trigger's body first and answers 400 naming each key path (never the
value); any other request passes untouched."""

from __future__ import annotations

import json
import re
from typing import Any

from taxiway_airflow.conf_numbers import bad_numbers

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
        if problems := _conf_problems(body, dag_from_path=trigger is not None or materialize):
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


def _conf_problems(body: bytes, dag_from_path: bool) -> list[tuple[str, str]]:
    """(key path, reason) of each number in the conf of a Taxiway trigger (``conf``) or backfill
    (``dag_run_conf``, its DAG in the body) that a task could not receive; a body that is no JSON
    object is Airflow's to refuse."""
    try:
        doc = json.loads(body)
    except ValueError:
        return []
    if not isinstance(doc, dict) or not dag_from_path and doc.get("dag_id") not in TAXIWAY_DAGS:
        return []
    conf = doc.get("conf" if dag_from_path else "dag_run_conf")
    if not isinstance(conf, dict):
        return []
    return [problem for key, value in conf.items() for problem in bad_numbers(value, str(key)[:80])]
