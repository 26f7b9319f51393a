"""Set a DAG run's note (the text the grid shows for a run) from a task or DAG callback.

Airflow 3 gives task code no database and its Execution API has no call that sets a note, so the
note goes through the public REST API (``PATCH /api/v2/dags/{dag}/dagRuns/{run}``, the official
``apache-airflow-client``), with the same settings as ``taxiway land``: ``TAXIWAY_AIRFLOW_URL`` and a
token or user + password (``pipelines.refresh.announce``). Where the process does hold the metadata
database (``dag.test()``, an embedded run) and no URL is set, the note is written there.
A note that cannot be set never fails anything: the caller gets the reason to log.
"""

from __future__ import annotations

import os

from pipelines.refresh import announce

MAX_NOTE = 1000  # Airflow's dag_run_note.content column holds 1000 characters


def set_note(dag_id: str, run_id: str, text: str) -> str | None:
    """Set the note; returns None when set, else why not (for the log)."""
    text = text[:MAX_NOTE]
    try:
        if announce.configured():
            _over_rest(dag_id, run_id, text)
        else:
            _in_database(dag_id, run_id, text)
    except Exception as exc:  # a note is a courtesy; the failure it describes is what matters
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return None


def _over_rest(dag_id: str, run_id: str, text: str) -> None:
    import airflow_client.client as af

    url = os.environ[announce.URL].rstrip("/")
    api = af.ApiClient(af.Configuration(host=url, access_token=announce.token(url)))
    af.DagRunApi(api).patch_dag_run(dag_id, run_id, af.DAGRunPatchBody(note=text), update_mask=["note"],
                                    _request_timeout=30)


def _in_database(dag_id: str, run_id: str, text: str) -> None:
    """Raises when this process has no database access (a worker: set ``TAXIWAY_AIRFLOW_URL``)."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    try:
        with create_session() as session:
            run = session.scalar(select(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id))
            if run is None:
                raise LookupError(f"{dag_id} has no run {run_id!r}")
            run.note = text
    except RuntimeError as exc:  # Airflow blocks the ORM in task processes
        raise RuntimeError(f"{exc}; set {announce.URL} and credentials so notes go over the REST API") from None
