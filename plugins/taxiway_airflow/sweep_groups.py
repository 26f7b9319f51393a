"""The stages ``taxiway_sweep`` chains after the shared preflight → tokenize: the member run folders,
one mapped task group per member (smoke → gang on either launcher → final checkpoint → evaluation), the ranking, and
the registration of the best member. Wiring only: task bodies live in ``tasks/sweep.py`` and ``tasks/train.py``."""

from __future__ import annotations

from typing import Any

from airflow.sdk import TaskGroup, task_group

from taxiway_airflow.links import MlflowRunLink, ModelVersionLink, with_links
from taxiway_airflow.placement import gpu_work, registry_work
from taxiway_airflow.stage_docs import STAGES
from taxiway_airflow.stage_groups import approval_steps, training
from taxiway_airflow.tasks import sweep as sweep_tasks
from taxiway_airflow.tasks import train as tasks


@task_group(group_id="member", **STAGES["member"]._asdict())
def member(run: Any) -> None:
    """One member, in its own run folder (mapped over the ``members`` task's list): the train stage's
    tasks on the deployment's launcher, with the same retries, then its evaluation. Gangs of members run
    side by side: a local gang picks a free rendezvous port at launch, a Kubernetes gang has a Service
    and Jobs named for its member, and each writes only under its own folder."""
    _, final = training(run)
    final >> tasks.evaluate.override(task_id="score", **gpu_work())(run)


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
