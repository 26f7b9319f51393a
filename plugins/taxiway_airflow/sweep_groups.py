"""The stages ``taxiway_sweep`` chains after the shared preflight → tokenize: the member run folders,
one mapped task group per member (smoke → gang → final checkpoint → evaluation), the ranking, and
the registration of the best member. Wiring only: task bodies live in ``tasks/sweep.py`` and ``tasks/train.py``."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.sdk import TaskGroup, task_group

from taxiway_airflow.links import MlflowRunLink, ModelVersionLink, with_links
from taxiway_airflow.operators.gang import TrainGang
from taxiway_airflow.placement import gpu_work, registry_work
from taxiway_airflow.sensors.checkpoint import CheckpointSensor
from taxiway_airflow.stage_docs import STAGES
from taxiway_airflow.stage_groups import approval_steps
from taxiway_airflow.tasks import sweep as sweep_tasks
from taxiway_airflow.tasks import train as tasks


@task_group(group_id="member", **STAGES["member"]._asdict())
def member(run: Any) -> None:
    """One member, in its own run folder (mapped over the ``members`` task's list): the train stage's
    tasks with the same retries, then its evaluation. Gangs of members run side by side: each picks
    a free rendezvous port at launch and writes only under its own folder."""
    gang = TrainGang(task_id="gang", run=run, retries=3, retry_delay=timedelta(seconds=10),
                     retry_exponential_backoff=2.0, max_retry_delay=timedelta(minutes=10), **gpu_work())
    final = CheckpointSensor(task_id="final_checkpoint", run=run)
    score = tasks.evaluate.override(task_id="score", **gpu_work())(run)
    tasks.smoke.override(task_id="smoke", **gpu_work())(run) >> gang >> final >> score


def sweep_stages(run: Any) -> tuple[Any, TaskGroup]:
    """Add the sweep's groups for the run folder XCom ``run``; returns the first task and the last group."""
    with TaskGroup("sweep", **STAGES["sweep"]._asdict()) as sweep:
        listed = sweep_tasks.members.override(task_id="members")(run)
        member.expand(run=listed) >> sweep_tasks.rank.override(task_id="rank")()  # upstream: the members only

    with TaskGroup("register", **STAGES["register_best"]._asdict()) as register:
        best = sweep_tasks.register_best.override(task_id="model_version", **registry_work())(run)
        with_links(best, (ModelVersionLink(), MlflowRunLink()))
        approval_steps(best, best)  # the best member's folder (tasks.common.approval_dir) holds its report
    sweep >> register
    return listed, register
