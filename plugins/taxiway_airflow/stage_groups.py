"""The stages the DAGs chain after their config task: preflight → tokenize → train → evaluate →
register, as task groups. Wiring only: task bodies live in ``tasks/``, operators in ``operators/``; the
training worker's queue and the registry's pool are the deployment's (``placement``)."""

from __future__ import annotations

import os
from typing import Any

from airflow.sdk import TaskGroup

from taxiway_airflow.links import EVALUATE_LINKS, REGISTER_LINKS, with_links
from taxiway_airflow.operators.approval import ApprovalGate, ApprovalReminder
from taxiway_airflow.operators.gang import TrainGang
from taxiway_airflow.placement import gang_retries, gpu_work, registry_work
from taxiway_airflow.sensors.checkpoint import CheckpointSensor
from taxiway_airflow.stage_docs import STAGES
from taxiway_airflow.tasks import train as tasks


def launcher() -> str:
    """Where the training gang runs is the deployment's choice, fixed when a DAG file is parsed (a
    DAG's shape cannot depend on a run's conf): TAXIWAY_LAUNCHER=local (default) or kubernetes."""
    value = os.environ.get("TAXIWAY_LAUNCHER", "local")
    if value not in ("local", "kubernetes"):
        raise ValueError(f"TAXIWAY_LAUNCHER={value!r}: expected 'local' or 'kubernetes'")
    return value


def data_stages(run: Any) -> tuple[TaskGroup, TaskGroup]:
    """preflight and tokenize for the run folder XCom ``run``: what a sweep's members share. Returns
    the first and the last group.

    The gate holds back the pack, and with it everything after; the tokenizer and the shards run
    beside the gate. Their work does not depend on the verdict (the tokenizer learns from the train
    split, which the gate never changes; a shard encodes groups of files as the manifest names them,
    and a decontaminated val is new groups the pack encodes), and what they cache is keyed by
    content they verify as they read it (``documents.read_documents``). The tokenizer starts once
    the scans are done, so the gate is queued with it, ahead of every shard: an executor's queue
    is first come, first served (Celery's is), and a gate queued behind the shards (as when the
    tokenizer followed the plan) gave its verdict only after them, on a slot of its own."""
    with TaskGroup("preflight", **STAGES["preflight"]._asdict()) as preflight:
        shards = tasks.preflight_plan.override(task_id="plan")(run)
        scanned = tasks.preflight_scan.override(task_id="scan").partial(run=run).expand(shard=shards)
        gate = tasks.preflight_gate.override(task_id="gate")(run, scanned)

    with TaskGroup("tokenize", **STAGES["tokenize"]._asdict()) as tokenize:
        shards = tasks.tokenize_plan.override(task_id="tokenizer")(run)
        scanned >> shards
        encoded = tasks.tokenize_shard.override(task_id="shard").partial(run=run).expand(shard=shards)
        pack = tasks.tokenize_pack.override(task_id="pack")(run)
        encoded >> pack

    gate >> pack
    return preflight, tokenize


def approval_steps(run: Any, registered: Any) -> None:
    """After ``registered``: a person's approval (``registry.approval: required``; skipped otherwise,
    with the decision after it), its reminder beside it, and the decision applied to the aliases."""
    gate = ApprovalGate(task_id="approval", run=run)
    registered >> [gate, ApprovalReminder(task_id="approval_reminder", run=run, approval_task_id=gate.task_id)]
    with_links(tasks.decide.override(task_id="decision", **registry_work())(run, gate.output), REGISTER_LINKS)


def training(run: Any) -> tuple[Any, Any]:
    """smoke → the gang on the deployment's launcher → the final checkpoint, for the run folder XCom ``run``
    (a sweep member's included), in the caller's task group; returns (first, last) to chain around.

    Local: ``TrainGang``. Kubernetes: headless Service (setup) → ``GangJob`` → teardown (docs/deploy.md).
    Either way the gang task holds the launcher; retries relaunch from the newest valid checkpoint."""
    smoke = tasks.smoke.override(task_id="smoke", **gpu_work())(run)
    if launcher() == "kubernetes":
        # the provider's operator costs ~1 s of every parse: imported only on this launcher
        from taxiway_airflow.operators.kubernetes import training_gang

        first, gang = training_gang(run, **gang_retries())  # its pods do the work: the default queue
    else:
        first = gang = TrainGang(task_id="gang", run=run, **gang_retries(), **gpu_work())
    final = CheckpointSensor(task_id="final_checkpoint", run=run)
    smoke >> first
    gang >> final
    return smoke, final


def all_stages(run: Any) -> tuple[TaskGroup, TaskGroup]:
    """Add the stage groups for the run folder XCom ``run``; returns the first and the last group."""
    preflight, tokenize = data_stages(run)
    with TaskGroup("train", **STAGES["train"]._asdict()) as train:
        training(run)

    with TaskGroup("evaluate", **STAGES["evaluate"]._asdict()) as evaluate:
        with_links(tasks.evaluate.override(task_id="score", **gpu_work())(run), EVALUATE_LINKS)

    with TaskGroup("register", **STAGES["register"]._asdict()) as register:
        registered = tasks.register.override(task_id="model_version", **registry_work())(run)
        approval_steps(run, with_links(registered, REGISTER_LINKS))

    tokenize >> train >> evaluate >> register
    return preflight, register
