"""Failure summaries: when a Taxiway run fails, say where, why in one line, and what to do next —
in the run folder (``failure.json``), as the task log's last line, and as the run's note in the grid.

``task_failed`` is every task's ``on_failure_callback`` (it runs on the worker once the task has
failed for good: retries spent, or a failure that is never retried) and sees the exception.
``dag_failed`` is the DAG's (it runs in the DAG processor when the run fails) and sees only the
last failed task; it keeps a task's summary of the same run, and otherwise writes its own (a run
timed out, a task killed without running its callback).

A run's summary is its first failure, per try of the run (Airflow's ``clear_number``): tasks that
run side by side can fail on one cause (a file that differs from the manifest fails the preflight
gate and the tokenize shard that reads it), and whichever callback came last used to win. A later
task's failure is still logged as its last line; a clear starts the next try, whose first failure
replaces the summary.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from airflow.sdk.exceptions import AirflowException

from eval.markdown import code, text
from pipelines.errors import BadInput, CheckFailed, Transient, kind_of
from pipelines.refresh import attempts
from pipelines.run_folder import RunFolder, run_dir
from taxiway_airflow.run_note import set_note
from trainer import fsio

log = logging.getLogger("taxiway")

MAX_REASON = 300
TASK_SUMMARY_WAIT_S = 10.0  # how long the DAG's callback waits for the failed task's own summary
_MANIFEST_LINE = re.compile(r"(\S+\.jsonl):(\d+)")
REFRESH_DAG = "taxiway_refresh"  # whose failures may count against the batches it tried (refresh.attempts)
SWEEP_MEMBER = "sweep.member."  # taxiway_sweep's mapped member group: one map index per member


@dataclass(frozen=True)
class FailureSummary:
    dag_id: str
    run_id: str
    task_id: str
    stage: str
    kind: str        # pipelines.errors' label, or "unexpected error"
    reason: str      # one line
    next: str        # what the user does about it
    run_folder: str
    at: str          # UTC ISO 8601
    member: str | None = None  # a sweep member ("02"): its failure is the member's, the sweep goes on
    clear_number: int = 0  # the run's try: how many times it was cleared when this failure came

    def line(self) -> str:
        """The task log's last line."""
        where = f"sweep member {self.member} " if self.member else ""
        return (f"TAXIWAY FAILURE at {where}{self.stage} ({self.task_id}, {self.kind}): {self.reason} | next: "
                f"{self.next} | run folder: {self.run_folder}")

    def note(self) -> str:
        """The run's note (Markdown, shown in the grid). The reason quotes conf keys and file names, which
        a trigger or the data chose: every value goes in escaped, so none can add a link, image or HTML."""

        task, reason, next_ = code(self.task_id), text(self.reason), text(self.next)
        if self.member:
            return (f"**Sweep member {text(self.member)} failed** ({task}, {text(self.kind)}): {reason}\n\n"
                    "The sweep goes on with the other members; this one is listed as failed in its ranking.\n\n"
                    f"**Next:** {next_}\n\nMember folder: {code(self.run_folder)}")
        return (f"**Failed at {text(self.stage)}** ({task}, {text(self.kind)}): {reason}\n\n"
                f"**Next:** {next_}\n\nRun folder: {code(self.run_folder)}")


def one_line(text: str, limit: int = MAX_REASON) -> str:
    """``text`` in one line of at most ``limit`` characters: its first line, followed by the lines
    that say FAIL when it is a report (the preflight gate's: "preflight FAILED" and one line per check),
    or by the lines it introduces when it ends with a colon ("invalid conf:" and one line per key)."""
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    if not lines:
        return ""
    failing = [ln.replace("[FAIL] ", "") for ln in lines[1:] if ln.startswith("[FAIL]")]
    if failing:
        first = f"{lines[0]}: {'; '.join(failing)}"
    elif lines[0].endswith(":") and len(lines) > 1:
        first = f"{lines[0]} {'; '.join(lines[1:])}"
    else:
        first = lines[0]
    return first if len(first) <= limit else first[:limit - 1] + "…"


def _root_cause(exc: BaseException | None) -> BaseException | None:
    """The stage's own exception under Airflow's wrapper (``failures.failure_kinds`` chains it)."""

    while isinstance(exc, AirflowException) and exc.__cause__ is not None:
        exc = exc.__cause__
    return exc


def kind_label(exc: BaseException | None) -> str:

    kind = kind_of(exc) if exc is not None else None
    return kind.label if kind is not None else "unexpected error"


def advice(stage: str, task_id: str, kind: str, reason: str, run_folder: str, tries: int) -> str:
    """What to do next, from where it failed and what kind of failure it was."""

    if task_id.startswith(SWEEP_MEMBER):
        return (f"nothing, for the sweep: the other members go on; to try this one again, clear {task_id} for its map "
                f"index (with downstream) — its logs are under {run_folder}/train/logs/")
    if task_id in ("resolve_config", "plan"):
        return "fix the conf or config field named above and trigger a new run"
    if stage == "preflight":
        if match := _MANIFEST_LINE.search(reason):
            return f"fix the manifest {match.group(1)} line {match.group(2)} and trigger a new run"
        if "manifest:" in reason:  # the gate's failing checks, one per "check: problems"
            return ("make the data and its manifest agree (fix the file named above, or rewrite the manifest with "
                    "`taxiway manifest DATA_DIR`) and trigger a new run")
        return (f"fix the data named above (preflight report: {run_folder}/preflight/report.md) and trigger a "
                "new run")
    if stage == "train":
        if kind == CheckFailed.label:
            return ("the gang ran past compute.timeout_s: trigger a new run with a larger budget, or clear the train "
                    "group to resume from its newest checkpoint with the same one")
        return ("resume: clear the train group (its newest valid checkpoint is kept); "
                f"the gang's logs are under {run_folder}/train/logs/")
    if kind == Transient.label:
        return (f"a service or the machine failed ({tries} tries); when it is back, clear {task_id} "
                "(with downstream) to resume")
    if kind == BadInput.label:
        return f"fix the input named above, then clear {task_id} (with downstream) or trigger a new run"
    if kind == CheckFailed.label:
        return f"the check said no: see the reason above; clear {task_id} after a fix"
    return f"read the log of {task_id} (an unexpected error); clear it (with downstream) after a fix"


def summarize(context: dict[str, Any], reason: str | None = None) -> FailureSummary:
    """A summary of the failed task in ``context``; ``reason`` when no exception is at hand."""

    ti = context["ti"]
    run_id, task_id = context["run_id"], ti.task_id
    exc = _root_cause(context.get("exception"))
    kind = kind_label(exc) if exc is not None else "failed (see the task log)"
    text = one_line(reason if reason is not None else (str(exc) or type(exc).__name__) if exc else "failed")
    index = getattr(ti, "map_index", -1)
    member = f"{index:02d}" if task_id.startswith(SWEEP_MEMBER) and index is not None and index >= 0 else None
    run = run_dir(ti.dag_id, run_id)
    folder = str(RunFolder(run).sweep_member(index) if member else run)
    return FailureSummary(dag_id=ti.dag_id, run_id=run_id, task_id=task_id, stage=task_id.split(".", 1)[0],
                          kind=kind, reason=text,
                          next=advice(task_id.split(".", 1)[0], task_id, kind, text, folder, ti.try_number),
                          run_folder=folder, at=datetime.now(UTC).isoformat(timespec="seconds"), member=member,
                          clear_number=_clear_number(context))


def _clear_number(context: dict[str, Any]) -> int:
    return getattr(context.get("dag_run"), "clear_number", None) or 0


def earlier_summary(folder: Path, run_id: str, clear_number: int) -> FailureSummary | None:
    """The summary already in ``folder`` for this try of the run, if one is."""

    try:
        earlier = FailureSummary(**json.loads(RunFolder(folder).failure_summary.read_text()))
    except (OSError, ValueError, TypeError):
        return None
    return earlier if (earlier.run_id, earlier.clear_number) == (run_id, clear_number) else None


def recorded(context: dict[str, Any]) -> FailureSummary | None:
    """The summary this try of the run in a DAG callback's ``context`` has (None while none is written)."""
    return earlier_summary(run_dir(context["dag"].dag_id, context["run_id"]), context["run_id"], _clear_number(context))


def record(summary: FailureSummary) -> None:
    """Write ``failure.json`` (atomically), set the note, and log the summary as the last line."""

    # written even when the run failed before its folder was made (resolve_config): the DAG's callback
    # then finds it instead of replacing the note with a poorer summary of its own. A sweep member's
    # goes to the member's folder: the run's failure.json stays the run's own
    fsio.write_json(RunFolder(Path(summary.run_folder)).failure_summary, asdict(summary))
    if summary.dag_id == REFRESH_DAG and not attempts.caused_by_data(summary.stage, summary.kind):
        attempts.excuse(summary.run_id, f"{summary.stage} ({summary.kind})")  # not its batches' fault
    if why := set_note(summary.dag_id, summary.run_id, summary.note()):
        log.warning("could not set the run's note: %s", why)
    log.error("%s", summary.line())


def task_failed(context: dict[str, Any]) -> None:
    """``on_failure_callback`` of every Taxiway task: the summary, unless this try of the run has one."""
    summary = summarize(context)
    if first := earlier_summary(Path(summary.run_folder), summary.run_id, summary.clear_number):
        log.error("%s (the run's summary stays its first failure, at %s)", summary.line(), first.task_id)
        return
    record(summary)


def dag_failed(context: dict[str, Any]) -> None:
    """``on_failure_callback`` of the DAG: keep the summary a task of this run wrote, else write one."""

    folder = run_dir(context["dag"].dag_id, context["run_id"])
    deadline = time.monotonic() + TASK_SUMMARY_WAIT_S
    while True:  # the failed task's callback may still be writing: the run's state reaches us first
        if earlier := earlier_summary(folder, context["run_id"], _clear_number(context)):
            record(earlier)
            return
        if time.monotonic() > deadline:
            break
        time.sleep(1.0)
    if context.get("ti") is None:  # no failed task known (e.g. the run timed out before any ran)
        log.error("TAXIWAY FAILURE of %s: %s", context["run_id"], context.get("reason"))
        return
    record(summarize(context, reason=f"{context.get('reason') or 'run failed'} (task {context['ti'].task_id})"))


CALLBACKS: dict[str, Any] = {"on_failure_callback": task_failed}  # default_args of the Taxiway DAGs
