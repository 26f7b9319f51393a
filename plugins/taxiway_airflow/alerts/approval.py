"""The approval reminder: a version has waited longer than ``registry.approval_reminder_s`` for a
person to approve or reject it. When to send it (and how often) is the approval task's to decide;
this says it, through the run's ``alerts``."""

from __future__ import annotations

from pipelines.config.alerts import AlertsConfig
from taxiway_airflow.alerts.alert import Alert, span
from taxiway_airflow.alerts.delivery import deliver


def approval_waiting(alerts: AlertsConfig, dag_id: str, run_id: str, model: str, waited_s: float) -> list[str]:
    """Alert that ``model`` (``models:/NAME/VERSION``, registered by the run ``dag_id``/``run_id``)
    has waited ``waited_s`` seconds for approval; returns the connection ids reached. Never raises."""
    return deliver(Alert("approval_waiting", dag_id, run_id,
                         f"{model} has waited {span(waited_s)} for approval to become champion: approve or reject "
                         "it in the run's approval task (Required actions)"), alerts)

