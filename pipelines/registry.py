"""MLflow: baselines in, registered model versions with lineage out.

One MLflow run per pipeline run (experiment = config name), keyed by the Airflow run id so a
retried register task finds its own earlier run and version instead of creating a second.
The ``champion`` alias moves only when the evaluation gate passed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from pipelines import lineage
from pipelines.config import RunConfig
from pipelines.paths import mlflow_artifact_root, mlflow_tracking_uri

RUN_KEY_TAG = "taxiway.run_key"


@dataclass(frozen=True)
class Baseline:
    kind: str            # champion | parent | uri
    uri: str
    version: str
    folder: Path         # downloaded model folder (model.safetensors, model.json, tokenizer.json)


def client():
    """A client bound to Taxiway's tracking URI, without touching MLflow's process-wide default."""
    from mlflow import MlflowClient

    uri = mlflow_tracking_uri()
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def _local_store(uri: str) -> bool:
    """SQLite or file stores keep artifacts under TAXIWAY_HOME; a server decides for itself."""
    return uri.startswith(("sqlite:", "file:")) or "://" not in uri


def _parse_models_uri(uri: str) -> tuple[str, str | None, str | None]:
    """``models:/NAME/VERSION`` or ``models:/NAME@ALIAS`` → (name, version, alias)."""
    if not uri.startswith("models:/"):
        raise ValueError(f"{uri!r}: expected models:/NAME/VERSION or models:/NAME@ALIAS")
    body = uri[len("models:/"):]
    if "@" in body:
        name, alias = body.split("@", 1)
        return name, None, alias
    name, _, version = body.partition("/")
    return name, version or None, None


def resolve_version(uri: str):
    """The ModelVersion a models:/ URI names; a clear error when it does not exist."""
    from mlflow.exceptions import MlflowException

    name, version, alias = _parse_models_uri(uri)
    c = client()
    try:
        return c.get_model_version_by_alias(name, alias) if alias else c.get_model_version(name, version)
    except MlflowException as exc:
        raise LookupError(f"{uri}: no such model version ({exc.message})") from None


def download(mv, dest: Path) -> Path:
    """The version's model folder, ``dest/<name>-v<version>``: downloaded once into a staging
    folder and renamed, so a retried task reuses a complete copy and never a partial one."""
    import mlflow

    final = dest / f"{mv.name}-v{mv.version}"
    if (final / "model.safetensors").is_file():
        return final
    dest.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".download.", dir=dest))
    try:
        got = Path(mlflow.artifacts.download_artifacts(artifact_uri=mv.source, dst_path=str(tmp),
                                                       tracking_uri=mlflow_tracking_uri()))
        if not (got / "model.safetensors").is_file():
            raise LookupError(f"models:/{mv.name}/{mv.version}: no model.safetensors in {mv.source}")
        os.rename(got, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def resolve_baseline(cfg: RunConfig, dest: Path) -> Baseline | None:
    """The model to beat, or None (nothing registered yet, or ``eval.baseline: init``)."""
    choice = cfg.eval.baseline
    if choice == "init":
        return None
    if choice == "champion":
        uri = f"models:/{cfg.registry.model_name}@{cfg.registry.champion_alias}"
        try:
            mv = resolve_version(uri)
        except LookupError:
            return None
        kind = "champion"
    else:
        uri = cfg.parent if choice == "parent" else choice
        if not uri:
            raise ValueError("eval.baseline: 'parent' needs a parent model (config field parent)")
        mv = resolve_version(uri)
        kind = "parent" if choice == "parent" else "uri"
    return Baseline(kind, uri, str(mv.version), download(mv, dest))


def _experiment_id(name: str) -> str:
    c = client()
    exp = c.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    local = _local_store(mlflow_tracking_uri())
    return c.create_experiment(name, artifact_location=f"{mlflow_artifact_root()}/{name}" if local else None)


def code_version() -> str:
    """Git SHA of the code that ran (``TAXIWAY_CODE_VERSION`` wins, e.g. an image tag)."""
    if os.environ.get("TAXIWAY_CODE_VERSION"):
        return os.environ["TAXIWAY_CODE_VERSION"]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def _metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _ms(iso: str | None, default: int) -> int:
    """Milliseconds since the epoch of a metrics.jsonl UTC timestamp (MLflow's metric time)."""
    return int(datetime.fromisoformat(iso).timestamp() * 1000) if iso else default


def _find_run(c, experiment_id: str, run_key: str):
    runs = c.search_runs([experiment_id], filter_string=f"tags.`{RUN_KEY_TAG}` = '{run_key}'", max_results=1)
    return runs[0] if runs else None


def _find_version(c, name: str, run_key: str):
    versions = c.search_model_versions(f"name = '{name}' and tags.`{RUN_KEY_TAG}` = '{run_key}'")
    return versions[0] if versions else None


def register(cfg: RunConfig, run_dir: Path, run_key: str, airflow: dict[str, str] | None = None) -> dict[str, Any]:
    """Log the run to MLflow and register its model; idempotent per ``run_key``."""
    from mlflow.entities import Metric, Param

    run_dir = Path(run_dir)
    c = client()
    eval_report = json.loads((run_dir / "eval" / "report.json").read_text())
    tags = lineage.tags(cfg, run_dir, eval_report, code_version(), airflow or {})
    tags[RUN_KEY_TAG] = run_key
    exp_id = _experiment_id(cfg.name)

    run = _find_run(c, exp_id, run_key)
    if run is not None and run.info.status != "FINISHED":
        c.delete_run(run.info.run_id)  # an earlier attempt died while logging: start that run over
        run = None
    if run is None:
        run = c.create_run(exp_id, run_name=run_key, tags=tags)
        run_id = run.info.run_id
        params = [Param(k, str(v)[:6000]) for k, v in lineage.flatten(cfg.model_dump(mode="json")).items()]
        for i in range(0, len(params), 100):
            c.log_batch(run_id, params=params[i:i + 100])
        now = int(time.time() * 1000)
        metrics = [Metric(key, float(rec[key]), _ms(rec.get("time"), now), int(rec["step"]))
                   for rec in _metrics(run_dir)
                   for key in ("loss", "lr", "grad_norm", "tokens_per_s") if rec.get(key) is not None]
        metrics += [Metric(f"eval.{who}.{key}", float(eval_report[who][key]), now, 0)
                    for who in ("candidate", "baseline") for key in ("loss", "bits_per_byte", "perplexity")]
        metrics.append(Metric("eval.improvement_bpb", float(eval_report["improvement_bpb"]), now, 0))
        for i in range(0, len(metrics), 500):
            c.log_batch(run_id, metrics=metrics[i:i + 500])
        for rel, dest in lineage.artifacts(run_dir):
            c.log_artifact(run_id, str(rel), artifact_path=dest)
        c.log_artifacts(run_id, str(run_dir / "model"), artifact_path="model")
        c.set_terminated(run_id)
    run_id = run.info.run_id

    name = cfg.registry.model_name
    if c.search_registered_models(f"name = '{name}'") == []:
        c.create_registered_model(name, description="Taxiway GPT models; see version tags for lineage.")
    mv = _find_version(c, name, run_key)
    if mv is None:
        mv = c.create_model_version(name, source=f"{c.get_run(run_id).info.artifact_uri}/model", run_id=run_id,
                                    tags=tags, description=eval_report["reason"])
    alias = cfg.registry.champion_alias if eval_report["passed"] else cfg.registry.challenger_alias
    c.set_registered_model_alias(name, alias, mv.version)
    c.set_model_version_tag(name, mv.version, "taxiway.alias_reason", eval_report["reason"])
    return {"model_name": name, "version": str(mv.version), "alias": alias, "run_id": run_id,
            "experiment": cfg.name, "uri": f"models:/{name}/{mv.version}"}
