"""The notifier for a failed run: a DAG's ``on_failure_callback``, listed after
``failure_summary.dag_failed`` so that it reports the run's failure summary (where it failed, why, in
one line) rather than Airflow's bare reason. It runs where the DAG's callbacks run (the DAG processor,
or the process of ``dag.test()``)."""

from __future__ import annotations

import logging
from typing import Any

from airflow.sdk import BaseNotifier

from pipelines.config import deployment
from pipelines.config.alerts import AlertsConfig
from pipelines.errors import BadInput
from pipelines.run_folder import run_dir
from taxiway_airflow.alerts.alert import Alert
from taxiway_airflow.alerts.delivery import deliver, why
from taxiway_airflow.alerts.once import claim
from taxiway_airflow.failure_summary import recorded
from taxiway_airflow.tasks.common import run_config

log = logging.getLogger("taxiway")


def run_alerts(dag_id: str, run_id: str) -> AlertsConfig:
    """The ``alerts`` a run was configured with: its run folder's, as its tasks read it (held to the
    deployment's config: only a deployment that lists them in ``limits.trigger_may_set`` lets a trigger
    set them), or the deployment's when the run failed before it had a folder, or with one refused."""
    try:
        return run_config(run_dir(dag_id, run_id)).alerts
    except BadInput:
        return deployment.config().alerts


def failure_line(context: dict[str, Any]) -> str:
    dag_id = context["dag"].dag_id
    if summary := recorded(context):
        return f"{dag_id} failed at {summary.stage} ({summary.task_id}, {summary.kind}): {summary.reason}"
    return f"{dag_id} failed: {context.get('reason') or 'run failed'}"


class RunFailedNotifier(BaseNotifier):
    """Alerts every connection of the run's ``alerts`` that the run failed; never raises."""

    def render_template_fields(self, context: Any, jinja_env: Any = None) -> None:
        """Nothing to render (no template fields); and ``dag.test()`` hands DAG callbacks the serialized
        DAG, which has no template environment to render with."""

    def notify(self, context: dict[str, Any]) -> None:
        try:
            dag_id, run_id = context["dag"].dag_id, context["run_id"]
            alert, cfg = Alert("run_failed", dag_id, run_id, failure_line(context)), run_alerts(dag_id, run_id)
        except Exception as exc:  # the run's failure is what matters; its alert is a courtesy
            log.warning("no alert for the failed run: %s", why(exc))
            return
        if (cfg.email or cfg.webhooks) and not claim(f"run_failed {dag_id} {run_id}"):
            log.info("the failure of %s was alerted before (a cleared run that failed again)", run_id)
            return
        deliver(alert, cfg)
