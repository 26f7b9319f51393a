"""The approval a deployment with ``registry.approval: required`` asks of a person before ``champion`` moves.

An Airflow human-in-the-loop task: since 3.3 it waits in ``awaiting_input`` without holding a worker
or a triggerer slot, answers in the UI's *Required actions* or over REST
(``PATCH /api/v2/dags/{dag}/dagRuns/{run}/taskInstances/register.approval/-1/hitlDetails``), and the
scheduler answers *Reject* for it once ``registry.approval_timeout_s`` passes. It shows what the
person decides on: the evaluation report (both sets for a refresh) with links to the full report, the
MLflow run and the model version. It is skipped, and the decision task with it, when the run's
registration is not waiting for approval (``approval: auto``, or a gate that failed).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

from airflow.providers.standard.operators.hitl import HITLOperator
from airflow.sdk import BaseOperator, Param
from airflow.sdk.exceptions import AirflowSkipException

from eval.markdown import text
from pipelines.registry.approval import MAX_COMMENT
from pipelines.run_folder import RunFolder
from pipelines.stages import register as register_stage
from taxiway_airflow import approvers
from taxiway_airflow.links import ROUTE, airflow_base, go_url
from taxiway_airflow.params import DIALECT
from taxiway_airflow.tasks.common import approval_dir, run_config
from taxiway_airflow.triggers.approval import ApprovalReminderTrigger
from trainer import fsio

log = logging.getLogger(__name__)
APPROVE, REJECT = "Approve", "Reject"
MAX_BODY = 20_000  # characters of the evaluation report shown in the request


def _not_waiting(run_dir: Any) -> None:
    if not register_stage.awaits_approval(run_dir):
        raise AirflowSkipException("registration is not waiting for approval "
                                   "(registry.approval is auto, or the gate did not pass)")


def body(run_dir: Any, dag_id: str, run_id: str) -> str:
    """Markdown for the person: what registration says, the evaluation report, and where to look further."""
    folder = RunFolder(run_dir)
    record = register_stage.registry_record(run_dir)
    report = folder.eval_summary.read_text(errors="replace") if folder.eval_summary.exists() else "(no report.md)"
    plot = f"{airflow_base()}{ROUTE}/runs/{quote(dag_id, safe='')}/{quote(run_id, safe='')}/comparison.png"
    report = report.replace("](comparison.png)", f"]({plot})")  # report.md's own, relative to its folder
    if len(report) > MAX_BODY:
        report = report[:MAX_BODY] + "\n\n… (cut; the full report is behind the link above)"
    links = " · ".join(f"[{label}]({go_url(target, dag_id, run_id)})" for label, target in (
        ("Evaluation report", "eval-report"), ("MLflow run", "mlflow-run"), ("Model version", "model-version")))
    return (f"**{text(record['model_name'])} version {text(record['version'])}** passed its gate and waits for your approval "
            f"to become `champion`. *Approve* moves the alias (only while the champion is still the model it was "
            f"evaluated against); *Reject* leaves it `challenger`.\n\n{links}\n\n---\n\n{report}")


class ApprovalGate(HITLOperator):
    """Approve or reject the version this run registered, with an optional comment kept on the version."""

    template_fields = ("subject", "body", "run")

    def __init__(self, *, run: Any, **kwargs: Any) -> None:
        kwargs.pop("params", None)  # the DAG's (the trigger form's): not what the person answers
        super().__init__(subject="Approve a model version for champion", options=[APPROVE, REJECT],
                         defaults=[REJECT],  # what the scheduler answers when the timeout passes
                         params={"comment": Param(None, type=["null", "string"], title="Comment",
                                                  description="Why (kept on the model version as a tag)",
                                                  **{"$schema": DIALECT})},
                         **kwargs)
        self.run = run

    def execute(self, context: Any) -> Any:
        run_dir = approval_dir()
        _not_waiting(run_dir)
        cfg = run_config(run_dir)
        record = register_stage.registry_record(run_dir)
        RunFolder(run_dir).approval_answer.unlink(missing_ok=True)  # a new question: an earlier try's answer is not this one's
        self.subject = f"Approve {record['model_name']} version {record['version']} as champion?"
        self.body = body(run_dir, context["dag"].dag_id, context["run_id"])
        self.response_timeout = timedelta(seconds=cfg.registry.approval_timeout_s)
        # Airflow lets only these users answer (403 to anyone else); decide() holds them to it again
        self.assigned_users = [{"id": user, "name": user} for user in approvers.people(cfg.registry.approvers)]
        return super().execute(context)

    def validate_params_input(self, params_input: Any) -> None:
        """Airflow's REST answer checks the options only, and has already said 200: a comment that is too
        long, not a string or beside unknown keys must not fail the approval afterwards. Only the comment
        is kept, as text, cut to ``MAX_COMMENT``."""
        comment = (params_input or {}).get("comment")
        super().validate_params_input({"comment": None if comment is None else str(comment)[:MAX_COMMENT]})

    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        """The answer as Airflow's human-in-the-loop record holds it (who answered, what, when; a timeout
        answers *Reject* for no one: ``timed_out``), written to the run folder's ``approval.json``, which
        the decision task reads: never an XCom, which a user who may edit XComs could write. ``event`` is
        that record: the api-server (or the scheduler's timeout sweep) builds it from the HITL row as it
        resumes the task, and no REST route writes it."""
        timed_out = bool(event.get("timedout"))
        answer = super().execute_complete(context, event)  # checks the options and the comment
        user = None if timed_out else answer["responded_by_user"]
        at = answer["responded_at"] or datetime.now(UTC)
        choice = ("timed_out" if not user else "approved" if answer["chosen_options"] == [APPROVE] else "rejected")
        out = {"choice": choice, "by": user and (user.get("name") or user.get("id")), "by_id": user and str(user["id"]),
               "at": at.astimezone(UTC).isoformat(timespec="seconds"),
               "comment": str((answer["params_input"] or {}).get("comment") or "")[:MAX_COMMENT]}
        fsio.write_json(RunFolder(approval_dir()).approval_answer, out)
        return out


class ApprovalReminder(BaseOperator):
    """Beside the approval: an alert (``alerts.*``) once it has waited ``registry.approval_reminder_s``;
    ends, quietly, as soon as the approval is answered (``ApprovalReminderTrigger``)."""

    template_fields = ("run",)

    def __init__(self, *, run: Any, approval_task_id: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run, self.approval_task_id = run, approval_task_id

    def execute(self, context: Any) -> None:
        run_dir = approval_dir()
        _not_waiting(run_dir)
        cfg = run_config(run_dir)
        if not (cfg.alerts.email or cfg.alerts.webhooks):
            raise AirflowSkipException("no alert connection (alerts.email, alerts.webhooks) to remind through")
        wait_s = cfg.registry.approval_reminder_s
        remind_at = datetime.now(UTC) + timedelta(seconds=wait_s)
        self.defer(trigger=ApprovalReminderTrigger(context["dag"].dag_id, context["run_id"], self.approval_task_id,
                                                   remind_at.isoformat(), poll_s=max(1.0, min(60.0, wait_s / 4))),
                   method_name="remind")

    def remind(self, context: Any, event: dict[str, Any]) -> None:
        if event["status"] != "due":
            log.info("the approval was answered (%s) before its reminder was due", event.get("state"))
            return
        from taxiway_airflow.alerts.approval import approval_waiting  # smtplib, urllib: only when one is due

        run_dir = approval_dir()
        try:
            cfg, record = run_config(run_dir), register_stage.registry_record(run_dir)
        except Exception as exc:  # the approval goes on; only its reminder is lost
            log.warning("approval reminder not sent: the run folder could not be read (%s)", exc)
            return
        reached = approval_waiting(cfg.alerts, context["dag"].dag_id, context["run_id"], record["uri"],
                                   cfg.registry.approval_reminder_s)
        log.info("approval reminder for %s sent to %s", record["uri"], ", ".join(reached) or "no alert connection")
