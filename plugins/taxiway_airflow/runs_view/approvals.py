"""Approvals waiting for a person: the ``register.approval`` human-in-the-loop tasks of Taxiway's DAGs
whose response has not come yet (Airflow's ``hitl_detail`` rows), each with its run, the model version
it would promote (the run folder's ``registry.json``) and Airflow's own page to answer it on."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from airflow.models.hitl import HITLDetail
from airflow.models.taskinstance import TaskInstance
from airflow.utils.session import create_session
from airflow.utils.state import TaskInstanceState
from sqlalchemy import select

from pipelines.run_folder import run_dir
from taxiway_airflow.runs_view.folder import registry

APPROVAL_TASK = "register.approval"
MAX_APPROVALS = 100  # oldest first: the longest waiting are the ones to see


@dataclass(frozen=True)
class Approval:
    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    subject: str
    created_at: datetime
    model: dict[str, Any]  # registry.json: model_name, version, … (empty before registration)

    def waited_s(self, now: datetime | None = None) -> float:
        return ((now or datetime.now(UTC)) - self.created_at).total_seconds()

    @property
    def link(self) -> str:
        """Airflow's required-actions page of the task (the UI's own route), where a person answers."""
        mapped = f"/mapped/{self.map_index}" if self.map_index >= 0 else ""
        return (f"/dags/{quote(self.dag_id, safe='')}/runs/{quote(self.run_id, safe='')}/tasks/"
                f"{quote(self.task_id, safe='')}{mapped}/required_actions")

    @property
    def version(self) -> str | None:
        """``models:/NAME/N`` once the run registered its version."""
        m = self.model
        return f"models:/{m['model_name']}/{m['version']}" if m.get("model_name") and m.get("version") else None

    def to_json(self) -> dict[str, Any]:
        return {"dag_id": self.dag_id, "run_id": self.run_id, "task_id": self.task_id, "subject": self.subject,
                "created_at": self.created_at.astimezone(UTC).isoformat().replace("+00:00", "Z"),
                "waited_s": round(self.waited_s(), 1), "model_version": self.version, "link": self.link}


def pending(dag_ids: tuple[str, ...]) -> list[Approval]:
    """The approvals of ``dag_ids`` still waiting for a response, oldest first, at most ``MAX_APPROVALS``."""
    query = (select(HITLDetail.subject, HITLDetail.created_at, TaskInstance.dag_id, TaskInstance.run_id,
                    TaskInstance.task_id, TaskInstance.map_index)
             .join(TaskInstance, HITLDetail.ti_id == TaskInstance.id)
             .where(TaskInstance.dag_id.in_(dag_ids), TaskInstance.task_id == APPROVAL_TASK,
                    HITLDetail.responded_at.is_(None),  # and still waiting, as Airflow's own list asks:
                    TaskInstance.state.in_((TaskInstanceState.AWAITING_INPUT, TaskInstanceState.DEFERRED)))
             .order_by(HITLDetail.created_at).limit(MAX_APPROVALS))
    with create_session() as session:
        rows = session.execute(query).all()
    return [Approval(dag, run, task, index, subject, created, registry(run_dir(dag, run)))
            for subject, created, dag, run, task, index in rows]
