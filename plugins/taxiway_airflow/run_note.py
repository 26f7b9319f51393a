"""Set a DAG run's note (the text the grid shows for a run) from a task or DAG callback.

Airflow 3 gives task code no database and its Execution API has no call that sets a note, so the
note goes through the public REST API (``PATCH /api/v2/dags/{dag}/dagRuns/{run}?update_mask=note``),
with the same settings as ``taxiway land``: ``TAXIWAY_AIRFLOW_URL`` and a token or user + password
(``pipelines.refresh.announce``). Where the process does hold the metadata database (``dag.test()``,
an embedded run) and no URL is set, the note is written there.
A note that cannot be set never fails anything: the caller gets the reason to log.

A task's failure callback runs after the task has reported its state, and Airflow's supervisor
kills a task still running ``[core] task_success_overtime`` later; killed, the task counts as
retryable, so a bad-input failure would be tried again. The note therefore has a budget of half that
overtime (at most 10 s), token and PATCH together, and goes over the standard library: the official
client's import alone took 1.5 s of CPU on an idle machine. The DAG's callback sets the note again
from ``failure.json`` when the run fails, so a note given up on here is not lost.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from urllib.parse import quote

from sqlalchemy import select

from pipelines.refresh import announce

MAX_NOTE = 1000  # Airflow's dag_run_note.content column holds 1000 characters
MAX_BUDGET_S = 10.0
def budget_s() -> float:
    """Seconds the note may take: half of this deployment's ``task_success_overtime``, at most 10."""
    try:
        from airflow.configuration import conf  # inside the try: a process without Airflow's core still gets a budget

        overtime = conf.getfloat("core", "task_success_overtime", fallback=20.0)
    except ImportError:  # a process without Airflow's core (no supervisor either)
        overtime = 20.0
    return min(MAX_BUDGET_S, overtime / 2)


def set_note(dag_id: str, run_id: str, text: str) -> str | None:
    """Set the note; returns None when set, else why not (for the log)."""
    text = text[:MAX_NOTE]
    try:
        if announce.configured():
            _over_rest(dag_id, run_id, text, deadline=time.monotonic() + budget_s())
        else:
            _in_database(dag_id, run_id, text)
    except Exception as exc:  # a note is a courtesy; the failure it describes is what matters
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return None


def _over_rest(dag_id: str, run_id: str, text: str, deadline: float) -> None:
    url = os.environ[announce.URL].rstrip("/")
    token = announce.token(url, timeout_s=max(0.1, deadline - time.monotonic()))
    request = urllib.request.Request(
        f"{url}/api/v2/dags/{quote(dag_id, safe='')}/dagRuns/{quote(run_id, safe='')}?update_mask=note",
        json.dumps({"note": text}).encode(), method="PATCH",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=max(0.1, deadline - time.monotonic())):
        pass  # urlopen raises HTTPError on any answer but 2xx


def _in_database(dag_id: str, run_id: str, text: str) -> None:
    """Raises when this process has no database access (a worker: set ``TAXIWAY_AIRFLOW_URL``)."""
    from airflow.models.dagrun import DagRun  # Airflow's ORM (~0.2 s): only the database path needs it
    from airflow.utils.session import create_session  # Airflow core: absent where only the task SDK is (see budget_s)

    try:
        with create_session() as session:
            run = session.scalar(select(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id))
            if run is None:
                raise LookupError(f"{dag_id} has no run {run_id!r}")
            run.note = text
    except RuntimeError as exc:  # Airflow blocks the ORM in task processes
        raise RuntimeError(f"{exc}; set {announce.URL} and credentials so notes go over the REST API") from None
