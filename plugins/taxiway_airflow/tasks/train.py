"""Tasks of ``taxiway_train``, which ``taxiway_refresh`` and ``taxiway_sweep`` reuse after their own
first tasks: the config, then one task (or mapped set of tasks) per step of each stage. A refresh
run's plan (``RefreshPlan.of_run``: None for any other run) is handed to the stages that take it."""

from __future__ import annotations

import json
import logging
from typing import Any

from airflow.sdk import get_current_context, task
from airflow.sdk.configuration import conf

from pipelines import run_folder
from pipelines.config import RunConfig
from pipelines.errors import CheckFailed
from pipelines.refresh.plan import RefreshPlan
from pipelines.registry import approval
from pipelines.run_folder import RunFolder
from pipelines.stages import evaluate as evaluate_stage
from pipelines.stages import preflight as preflight_stage
from pipelines.stages import register as register_stage
from pipelines.stages import tokenize as tokenize_stage
from pipelines.stages import train as train_stage
from taxiway_airflow import approvers
from taxiway_airflow.failures import translated
from taxiway_airflow.tasks.common import TASK, approval_dir, conf_config, own_dir, prepared, run_config, run_dir_of

log = logging.getLogger("taxiway")


def max_mapped(cfg: RunConfig) -> int:
    """Most shards a stage fans out to: the deployment's ``limits.mapped_tasks``, and never more than
    Airflow maps (``[core] max_map_length``); shards grow to fit, whatever their configured size."""
    return min(cfg.limits.mapped_tasks, conf.getint("core", "max_map_length"))


@task(**TASK)
@translated
def resolve_config() -> dict[str, Any]:
    """Config file + conf overlay + ``set`` → validated RunConfig in ``<run>/config.yaml``.

    A bad config fails here, naming each bad field, before any stage runs (bad input: never retried).
    """
    ctx = get_current_context()
    trigger_conf = ctx["dag_run"].conf or {}  # exactly what the trigger sent; params also hold form defaults
    return prepared(conf_config(trigger_conf), run_folder.run_dir(ctx["dag"].dag_id, ctx["run_id"]))


@task(**TASK)
@translated
def preflight_plan(run: dict[str, Any]) -> list[int]:
    """Cut the corpus into shards (``<run>/preflight/plan.json``); their ids, one scan task each, no
    more than ``max_mapped``."""
    run_dir = run_dir_of(run)
    cfg = run_config(run_dir)
    return preflight_stage.plan(cfg, run_dir, max_shards=max_mapped(cfg))


@task(**TASK)
@translated
def preflight_scan(shard: int, run: dict[str, Any]) -> dict[str, Any]:
    """Read one shard's files once for every check; cached by content, so a retry is cheap."""
    run_dir = run_dir_of(run)
    result = preflight_stage.shard(run_config(run_dir), run_dir, shard)
    log.info("shard %d (%s): %d file(s), %d document(s), %s %s", shard, result.split, len(result.files),
             len(result.rows), "cache hit" if result.cache_hit else "scanned, cached as", result.key)
    return {"shard": shard, "key": result.key, "cache_hit": result.cache_hit}


@task(**TASK)
@translated
def preflight_gate(run: dict[str, Any], scanned: list[dict[str, Any]]) -> dict[str, Any]:
    """Judge the checks from the shard results into ``preflight/report.json``; fail the run if any
    check failed (the error and the log name each failed check and why)."""
    run_dir = run_dir_of(run)
    keys = [s["key"] for s in sorted(scanned, key=lambda s: s["shard"])]
    report = preflight_stage.reduce(run_config(run_dir), run_dir, keys)
    log.info("%s", report.summary())
    if not report.passed:
        raise CheckFailed(report.summary())
    return {"passed": True}


@task(**TASK)
@translated
def tokenize_plan(run: dict[str, Any]) -> list[dict[str, Any]]:
    """Train or load the tokenizer (cached by content) and cut the data into the shards the mapped
    ``shard`` tasks encode, no more than ``max_mapped``; returns one small
    record per shard (the plan itself is in the run folder)."""
    run_dir = run_dir_of(run)
    cfg = run_config(run_dir)
    shards = tokenize_stage.plan(cfg, run_dir, max_shards=max_mapped(cfg))
    log.info("%d shard(s) of %d file group(s), %d bytes", len(shards), sum(s["groups"] for s in shards),
             sum(s["bytes"] for s in shards))
    return shards


@task(**TASK)
@translated
def tokenize_shard(run: dict[str, Any], shard: dict[str, Any]) -> dict[str, Any]:
    """Encode one shard's groups into the token cache on one thread; cached groups are skipped, so
    a retry or a re-run redoes only what is missing."""
    stats = tokenize_stage.shard(run_dir_of(run), shard["shard"])
    log.info("shard %d: %d group(s) encoded (%d documents, %d tokens), %d already cached, in %.2f s", stats["shard"],
             stats["encoded"], stats["documents"], stats["tokens"], stats["cached"], stats["seconds"])
    return stats


@task(**TASK)
@translated
def tokenize_pack(run: dict[str, Any]) -> dict[str, Any]:
    """The reduce: packs the groups the shards left in the cache (plus a refresh's replay and fresh val)."""
    run_dir = run_dir_of(run)
    packed = tokenize_stage.reduce(run_config(run_dir), run_dir, RefreshPlan.of_run(run_dir))
    stats = packed.manifest()
    log.info("%s %s: %s", "cache hit" if packed.cache_hit else "packed", packed.path,
             {s: {k: v[k] for k in ("documents", "tokens", "windows")} for s, v in stats["splits"].items()})
    return {"path": str(packed.path), "key": packed.key, "cache_hit": packed.cache_hit}


@task(**TASK)
@translated
def smoke(run: dict[str, Any]) -> dict[str, Any]:
    """One process, a few steps, save, resume: fails in seconds before the gang is scheduled."""
    run_dir = run_dir_of(run)
    result = train_stage.smoke(run_config(run_dir), run_dir)
    log.info("smoke passed: step %s, loss %s", result["step"], result["loss"])
    return {"loss": result["loss"]}


@task(**TASK)
@translated
def evaluate(run: dict[str, Any]) -> dict[str, Any]:
    run_dir = run_dir_of(run)
    report = evaluate_stage.run(run_config(run_dir), run_dir, refresh=RefreshPlan.of_run(run_dir))
    log.info("%s", report["reason"])
    return {"passed": report["passed"], "improvement_bpb": report["improvement_bpb"]}


@task(**TASK)
@translated
def register(run: dict[str, Any]) -> dict[str, Any]:
    """Idempotent per Airflow run: a retry reuses the MLflow run and model version it made."""
    ctx = get_current_context()
    run_dir = run_dir_of(run)
    airflow = {"dag_id": ctx["dag"].dag_id, "run_id": ctx["run_id"]}
    key = run_folder.run_key(ctx["dag"].dag_id, ctx["run_id"])
    result = register_stage.run(run_config(run_dir), run_dir, key, airflow, RefreshPlan.of_run(run_dir))
    log.info("registered %s version %s: %s", result["model_name"], result["version"],
             "waiting for approval" if result.get("approval") == "pending" else f"alias '{result['alias']}'")
    return result


@task(**TASK)
@translated
def decide(run: dict[str, Any], decision: dict[str, Any] | None = None) -> dict[str, Any]:
    """The person's answer to ``register.approval`` applied: ``champion`` on an approval (while the champion
    is still the model it was evaluated against), else ``challenger``; who, when and why on the version.
    The answer is the one ``register.approval`` wrote from Airflow's human-in-the-loop record into the run
    folder, never its XCom (``decision`` only orders this task after it); refused, and the version left
    pending, when it comes from the user who triggered the run or from anyone not in ``registry.approvers``."""
    ctx = get_current_context()
    run_dir, own = approval_dir(), own_dir()  # a sweep's best member's folder, and the sweep's own
    answer = RunFolder(run_dir).approval_answer
    if not answer.exists():
        raise CheckFailed(f"{answer}: missing; register.approval recorded no answer (a task marked success by "
                          "hand answers nothing): clear register.approval to ask again")
    cfg = run_config(run_dir)
    result = register_stage.decide(cfg, run_dir, approval.Decision(**json.loads(answer.read_text())), mirror=own,
                                   triggered_by=ctx["dag_run"].triggering_user_name,
                                   approvers=approvers.people(cfg.registry.approvers))
    log.info("%s version %s %s: alias '%s'", result["model_name"], result["version"], result["approval"], result["alias"])
    return result
