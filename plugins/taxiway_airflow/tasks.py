"""Task callables for the ``taxiway_train`` DAG: thin wrappers around ``pipelines.stages``.

Tasks pass only the run folder through XCom; each stage reads ``config.yaml`` from it. Heavy
libraries are imported inside the stage functions, never here.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from airflow.sdk import get_current_context, task

from pipelines.errors import CheckFailed
from taxiway_airflow.failures import RETRY, translated

log = logging.getLogger("taxiway")

# every Taxiway @task: retried with the back-off of RETRY; a returned dict is one XCom, since its
# consumers take it whole (Airflow infers multiple_outputs from a dict annotation and would push each
# key too: one more execution-API call and database write per key, on every mapped shard)
TASK: dict[str, Any] = {"retries": 2, **RETRY, "multiple_outputs": False}


def _run_dir(run: dict[str, Any]) -> Path:
    return Path(run["run_dir"])


def _field(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def conf_config(conf: dict[str, Any]):
    """The run's config from its trigger's ``conf``: the config file the conf names (or the
    deployment's), the conf's sections and form fields (``params.overrides_from_conf``: what differs
    from the form's defaults) and ``set`` overlaid as values, refused where only the deployment sets a
    field; every data path checked against the data roots."""
    from pipelines.config.load import load_triggered
    from pipelines.roots import DATA_FIELDS, Roots
    from taxiway_airflow.params import check_conf, default_config_path, overrides_from_conf

    roots = Roots.from_env()
    check_conf(conf)
    path = roots.config_file(conf.get("config") or default_config_path())
    cfg = load_triggered(path, overrides_from_conf(conf), list(conf.get("set") or []), roots)
    roots.check_data({f: _field(cfg, f) for f in DATA_FIELDS})
    return cfg


def prepared(cfg: Any, run_dir: Path) -> dict[str, Any]:
    from pipelines import stages

    stages.prepare(cfg, run_dir)
    log.info("run folder %s, config sha256 %s", run_dir, cfg.sha256())
    return {"run_dir": str(run_dir), "config_sha256": cfg.sha256(), "name": cfg.name}


@task(**TASK)
@translated
def resolve_config() -> dict[str, Any]:
    """Config file + conf overlay + ``set`` → validated RunConfig in ``<run>/config.yaml``.

    A bad config fails here, naming each bad field, before any stage runs (bad input: never retried).
    """
    from pipelines import run_folder

    ctx = get_current_context()
    conf = ctx["dag_run"].conf or {}  # exactly what the trigger sent; params also hold form defaults
    return prepared(conf_config(conf), run_folder.run_dir(ctx["dag"].dag_id, ctx["run_id"]))


@task.short_circuit(**TASK)
@translated
def refresh_plan() -> dict[str, Any] | None:
    """Decide what this refresh does (docs/refresh.md): the champion to continue and the landed
    batches new to it. Nothing new (or no champion) → one log line saying why and every later task
    skipped; else the refresh's config in ``<run>/config.yaml``."""
    from pipelines import run_folder
    from pipelines.refresh import plan

    ctx = get_current_context()
    run_dir = run_folder.run_dir(ctx["dag"].dag_id, ctx["run_id"])
    decision = plan.decide(conf_config(ctx["dag_run"].conf or {}), run_dir, ctx["run_id"])
    log.info("%s", decision.reason)
    return None if decision.config is None else prepared(decision.config, run_dir)


@task(**TASK)
@translated
def land_batch(source: str, batch_id: str | None) -> dict[str, Any]:
    """Land the folder ``source`` as a batch of the deployment's landing zone; the task's outlet (the
    landing asset, set by the DAG) is what starts ``taxiway_refresh``. A retry after the batch
    landed finds it complete and announces it again instead of landing it twice."""
    from pipelines.config import load_config
    from pipelines.refresh import landing
    from pipelines.refresh.announce import event_extra
    from pipelines.roots import Roots
    from taxiway_airflow.params import default_config_path

    ctx = get_current_context()
    roots = Roots.from_env()
    zone = load_config(roots.config_file(default_config_path())).refresh.landing
    if not zone:
        raise landing.LandingError("refresh.landing: not set in the deployment's config; nowhere to land")
    (outlet,) = [a for a in ctx["task"].outlets if getattr(a, "name", None) == landing.ASSET_NAME]
    if outlet.uri != landing.asset_uri(zone):
        raise landing.LandingError(f"refresh.landing is {zone} where this task runs, but the DAG was parsed with "
                                   f"{outlet.uri}: the worker and the DAG processor must read one config")
    roots.check_data({"source": source})
    batch_id = batch_id or ctx["run_id"].replace(":", "").replace("+", "")
    earlier = [b for b in landing.scan(zone)[0] if b.id == batch_id] if ctx["ti"].try_number > 1 else []
    batch = earlier[0] if earlier else landing.land(source, zone, batch_id)
    log.info("batch %s %s in %s: %d file(s), manifest sha256 %s", batch.id, "was landed by an earlier try" if earlier
             else "landed", zone, batch.files, batch.manifest_sha256)
    ctx["outlet_events"][outlet].extra = event_extra(batch)
    return event_extra(batch)


@task(**TASK)
@translated
def assemble(run: dict[str, Any]) -> dict[str, Any]:
    """The refresh's dataset: new train files without repeats of trained data, the fixed val set,
    the held-out new files."""
    from airflow.sdk.exceptions import AirflowSkipException

    from pipelines import stages
    from pipelines.refresh.assemble import NothingNew
    from pipelines.refresh.assemble import assemble as build

    run_dir = _run_dir(run)
    try:
        summary = build(stages.load_run_config(run_dir), run_dir)
    except NothingNew as exc:  # every later task is skipped, as when the plan finds nothing new
        log.info("%s", exc)
        raise AirflowSkipException(str(exc)) from None
    for batch in summary["batches"]:
        log.info("batch %s: %d train file(s), %d held out (from %s), %d document(s) dropped as repeats of trained "
                 "data%s", batch["batch"], batch["train_files"], batch["held_out_files"], batch["held_out_from"],
                 len(batch["dropped_documents"]),
                 "".join(f"\n  {d['document']} repeats {d['repeats']} (Jaccard ~{d['jaccard']})"
                         for d in batch["dropped_documents"]))
    return {"train_files": summary["train_files"], "fresh_files": summary["fresh_files"],
            "dropped_documents": summary["dropped_documents"]}


@task(**TASK)
@translated
def preflight_plan(run: dict[str, Any]) -> list[int]:
    """Cut the corpus into shards (``<run>/preflight/plan.json``); their ids, one scan task each, no
    more than Airflow maps (``[core] max_map_length``)."""
    from airflow.configuration import conf

    from pipelines import preflight, stages

    run_dir = _run_dir(run)
    return preflight.plan_shards(stages.load_run_config(run_dir), run_dir,
                                 max_shards=conf.getint("core", "max_map_length"))


@task(**TASK)
@translated
def preflight_scan(shard: int, run: dict[str, Any]) -> dict[str, Any]:
    """Read one shard's files once for every check; cached by content, so a retry is cheap."""
    from pipelines import preflight, stages

    run_dir = _run_dir(run)
    result = preflight.scan_shard(stages.load_run_config(run_dir), run_dir, shard)
    log.info("shard %d (%s): %d file(s), %d document(s), %s %s", shard, result.split, len(result.files),
             len(result.rows), "cache hit" if result.cache_hit else "scanned, cached as", result.key)
    return {"shard": shard, "key": result.key, "cache_hit": result.cache_hit}


@task(**TASK)
@translated
def preflight_gate(run: dict[str, Any], scanned: list[dict[str, Any]]) -> dict[str, Any]:
    """Judge the checks from the shard results into ``preflight/report.json``; fail the run if any
    check failed (the error and the log name each failed check and why)."""
    from pipelines import preflight, stages

    run_dir = _run_dir(run)
    keys = [s["key"] for s in sorted(scanned, key=lambda s: s["shard"])]
    report = preflight.reduce_and_gate(stages.load_run_config(run_dir), run_dir, keys)
    log.info("%s", report.summary())
    if not report.passed:
        raise CheckFailed(report.summary())
    return {"passed": True}


@task(**TASK)
@translated
def tokenize_plan(run: dict[str, Any]) -> list[dict[str, Any]]:
    """Train or load the tokenizer (cached by content) and cut the data into the shards the mapped
    ``shard`` tasks encode, no more than Airflow maps (``[core] max_map_length``); returns one small
    record per shard (the plan itself is in the run folder)."""
    from airflow.sdk.configuration import conf

    from pipelines import stages

    run_dir = _run_dir(run)
    shards = stages.tokenize_plan(stages.load_run_config(run_dir), run_dir, conf.getint("core", "max_map_length"))
    log.info("%d shard(s) of %d file group(s), %d bytes", len(shards), sum(s["groups"] for s in shards),
             sum(s["bytes"] for s in shards))
    return shards


@task(**TASK)
@translated
def tokenize_shard(run: dict[str, Any], shard: dict[str, Any]) -> dict[str, Any]:
    """Encode one shard's groups into the token cache on one thread; cached groups are skipped, so
    a retry or a re-run redoes only what is missing."""
    from pipelines import stages

    stats = stages.tokenize_shard(_run_dir(run), shard["shard"])
    log.info("shard %d: %d group(s) encoded (%d documents, %d tokens), %d already cached, in %.2f s", stats["shard"],
             stats["encoded"], stats["documents"], stats["tokens"], stats["cached"], stats["seconds"])
    return stats


@task(**TASK)
@translated
def tokenize(run: dict[str, Any]) -> dict[str, Any]:
    """The reduce: packs the groups the shards left in the cache (plus a refresh's replay and fresh val)."""
    from pipelines import stages

    run_dir = _run_dir(run)
    packed = stages.tokenize(stages.load_run_config(run_dir), run_dir)
    stats = packed.manifest()
    log.info("%s %s: %s", "cache hit" if packed.cache_hit else "packed", packed.path,
             {s: {k: v[k] for k in ("documents", "tokens", "windows")} for s, v in stats["splits"].items()})
    return {"path": str(packed.path), "key": packed.key, "cache_hit": packed.cache_hit}


@task(**TASK)
@translated
def smoke(run: dict[str, Any]) -> dict[str, Any]:
    """One process, a few steps, save, resume: fails in seconds before the gang is scheduled."""
    from pipelines import stages

    run_dir = _run_dir(run)
    result = stages.smoke(stages.load_run_config(run_dir), run_dir)
    log.info("smoke passed: step %s, loss %s", result["step"], result["loss"])
    return {"loss": result["loss"]}


@task(**TASK)
@translated
def evaluate(run: dict[str, Any]) -> dict[str, Any]:
    from pipelines import stages

    run_dir = _run_dir(run)
    report = stages.evaluate(stages.load_run_config(run_dir), run_dir)
    log.info("%s", report["reason"])
    return {"passed": report["passed"], "improvement_bpb": report["improvement_bpb"]}


@task(**TASK)
@translated
def register(run: dict[str, Any]) -> dict[str, Any]:
    """Idempotent per Airflow run: a retry reuses the MLflow run and model version it made."""
    from pipelines import run_folder, stages

    ctx = get_current_context()
    run_dir = _run_dir(run)
    airflow = {"dag_id": ctx["dag"].dag_id, "run_id": ctx["run_id"]}
    key = run_folder.run_key(ctx["dag"].dag_id, ctx["run_id"])
    result = stages.register(stages.load_run_config(run_dir), run_dir, key, airflow)
    log.info("registered %s version %s as '%s'", result["model_name"], result["version"], result["alias"])
    return result


# --- the Kubernetes gang's setup and teardown (TAXIWAY_LAUNCHER=kubernetes) ----------------------

def create_service(run: dict[str, Any], run_id: str) -> dict[str, str]:
    """Write the trainer spec and create the headless Service that makes rank 0 resolvable (idempotent)."""
    from kubernetes.client.exceptions import ApiException

    from pipelines import training
    from taxiway_airflow.hooks.kubernetes import connect
    from taxiway_airflow.operators.kubernetes import render_for_run

    cfg, gang = render_for_run(run, run_id, 1)
    training.write_spec(cfg, _run_dir(run))
    hook = connect(cfg.compute.kubernetes.connection_id)
    try:
        hook.core_v1_client.create_namespaced_service(gang.namespace, gang.service)
        log.info("created headless Service %s/%s", gang.namespace, gang.service_name)
    except ApiException as exc:
        if exc.status != 409:
            raise
        log.info("headless Service %s/%s already exists (a retried setup)", gang.namespace, gang.service_name)
    return {"service": gang.service_name, "namespace": gang.namespace}


def delete_everything(run: dict[str, Any], run_id: str) -> int:
    """Every Job of the run (their pods waited for) and the Service; returns the Jobs deleted."""
    from taxiway_airflow.hooks.kubernetes import connect, ignore_missing, remove_jobs
    from taxiway_airflow.operators.kubernetes import render_for_run

    cfg, gang = render_for_run(run, run_id, 1)
    k = cfg.compute.kubernetes
    hook = connect(k.connection_id)
    jobs = remove_jobs(hook, gang.namespace, gang.service_name, wait_s=k.termination_grace_s + 60)
    ignore_missing(hook.core_v1_client.delete_namespaced_service, gang.service_name, gang.namespace)
    log.info("deleted %d Job(s) and Service %s/%s; no pod of the gang is left", jobs, gang.namespace,
             gang.service_name)
    return jobs


@task(**TASK)
@translated
def gang_service(run: dict[str, Any]) -> dict[str, str]:
    """Setup: the headless Service of the run's gang."""
    return create_service(run, get_current_context()["run_id"])


@task(**TASK)
@translated
def delete_gang(run: dict[str, Any]) -> dict[str, Any]:
    """Teardown: runs whatever the gang did, so nothing of the run is left in the cluster."""
    return {"jobs_deleted": delete_everything(run, get_current_context()["run_id"])}
