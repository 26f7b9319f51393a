"""The MLflow run of a pipeline run, and the model version registered from it.

One MLflow run per pipeline run (experiment = config name), keyed by the Airflow run id (tag
``taxiway.run_key``) so a retried register task finds its own earlier run and version instead
of creating a second: every step checks what exists before it writes, which also makes the
whole registration safe to retry after a transient MLflow failure. The training sensor opens the
run while the gang trains and ships metrics into it (``ship``); ``register`` completes it with
params, metrics, datasets, artifacts and lineage tags, and creates the model version. No alias
moves here: that is ``champion``'s.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
import warnings
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pipelines.config import RegistryConfig, RunConfig
from pipelines.errors import BadInput
from pipelines.registry import lineage, served
from pipelines.registry import metrics as live_metrics
from pipelines.registry.client import CHECKPOINT_ARTIFACT, client, with_retries
from pipelines.run_folder import RunFolder, mlflow_artifact_root, mlflow_tracking_uri

RUN_KEY_TAG = "taxiway.run_key"   # run_folder.run_key of an Airflow run (or the CLI's run key): its identity
# MLflow 3's UI opens an experiment on the page its kind names; untagged, it may open the GenAI traces
# page. "custom_model_development" is the UI's "Machine learning" kind: runs, metrics, models.
EXPERIMENT_KIND_TAG, EXPERIMENT_KIND = "mlflow.experimentKind", "custom_model_development"
LIVE_TAG = "taxiway.live"         # opened by the training sensor to ship metrics while the gang runs
LOGGING_TAG = "taxiway.logging"   # registration started logging into this run


@dataclass(frozen=True)
class Registered:
    """A pipeline run logged to MLflow and its model version (no alias moved yet)."""

    model_name: str
    version: str
    run_id: str
    experiment: str

    @property
    def uri(self) -> str:
        return f"models:/{self.model_name}/{self.version}"

    def record(self, alias: str | None, reason: str) -> dict[str, Any]:
        """What registration made, as ``registry.json`` holds it (``alias`` None: waiting for approval)."""
        return {"model_name": self.model_name, "version": self.version, "alias": alias, "reason": reason,
                "run_id": self.run_id, "experiment": self.experiment, "uri": self.uri}


def code_version() -> str:
    """Git SHA of the code that ran, ``-dirty`` when tracked files differ from it
    (``TAXIWAY_CODE_VERSION`` wins, e.g. an image tag)."""
    if os.environ.get("TAXIWAY_CODE_VERSION"):
        return os.environ["TAXIWAY_CODE_VERSION"]
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, cwd=here)
        if sha.returncode != 0 or not sha.stdout.strip():
            return "unknown"
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--"], capture_output=True, timeout=30, cwd=here)
        return sha.stdout.strip() + ("-dirty" if dirty.returncode == 1 else "")
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def _experiment_id(c, name: str) -> str:
    from mlflow.exceptions import MlflowException  # mlflow (~1 s): DAG parse must not pay for it

    exp = c.get_experiment_by_name(name)
    if exp is not None:
        if EXPERIMENT_KIND_TAG not in exp.tags:  # made before Taxiway tagged its experiments; a user's choice stays
            c.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
        return exp.experiment_id
    server = mlflow_tracking_uri().startswith(("http://", "https://", "databricks"))
    try:  # a server picks its own artifact store; a database store keeps artifacts under TAXIWAY_HOME
        return c.create_experiment(name, artifact_location=None if server else f"{mlflow_artifact_root()}/{name}",
                                   tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        return c.get_experiment_by_name(name).experiment_id  # another run created it meanwhile


def run_name(cfg: RunConfig, run_key: str) -> str:
    """What people see in the runs table: the config's name, the UTC time the run was opened, and a
    short id from the run key (stable for retries; the key itself stays in the tag RUN_KEY_TAG)."""
    short = hashlib.sha256(run_key.encode()).hexdigest()[:6]
    return f"{cfg.name} {datetime.now(UTC):%Y-%m-%d %H:%M} UTC {short}"


def version_description(report: dict[str, Any]) -> str:
    """One line for the model version page; the figures behind it are its tags (``lineage.eval_tags``)
    and the run's ``eval/report.md``."""
    c, b = report["candidate"], report["baseline"]
    return (f"Gate {'passed' if report['passed'] else 'failed'} vs {b['label']}: {c['bits_per_byte']:.4f} vs "
            f"{b['bits_per_byte']:.4f} bits/byte ({report['improvement_bpb']:+.4f}). Details: version tags, "
            "run artifact eval/report.md.")


def _eval_metrics(report: dict[str, Any], step: int):
    from mlflow.entities import Metric  # mlflow (~1 s): DAG parse must not pay for it

    now = int(time.time() * 1000)
    out = [Metric(f"eval.{who}.{key}", float(report[who][key]), now, step)
           for who in ("candidate", "baseline") for key in ("loss", "bits_per_byte", "perplexity")]
    gate = report["gate"]
    out += [Metric(f"eval.{key}", float(gate[key]), now, step) for key in ("improvement_bpb", "lower_bpb", "upper_bpb")]
    out += [Metric(key, value, now, step) for key, value in live_metrics.forgetting(report).items()]
    return out


def _log_datasets(c, run_id: str, cfg: RunConfig, run_dir: Path) -> None:
    """The data as MLflow dataset inputs (what ``mlflow.log_input`` logs, bound to this client)."""
    # mlflow (~1 s): DAG parse must not pay for it
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset  # mlflow (~1 s): DAG parse must not pay for it
    from mlflow.entities import DatasetInput, InputTag  # mlflow (~1 s): DAG parse must not pay for it
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT  # mlflow (~1 s): DAG parse must not pay for it

    inputs = []
    for ref in lineage.datasets(cfg, run_dir):
        with warnings.catch_warnings():  # MLflow registers its local-file source class twice and says so
            warnings.filterwarnings("ignore", message="The specified dataset source can be interpreted")
            source = resolve_dataset_source(ref.source)
        dataset = MetaDataset(source, name=ref.name, digest=ref.digest)
        tags = [InputTag(k, v) for k, v in ref.tags.items()] + [InputTag(MLFLOW_DATASET_CONTEXT, ref.context)]
        inputs.append(DatasetInput(dataset._to_mlflow_entity(), tags))
    c.log_inputs(run_id, datasets=inputs)


def literal(text: str, what: str) -> str:
    """``text`` as a string in an MLflow search filter: MLflow's filter grammar has no escape for a
    quote, so a value holding one could end the string early; such a value is refused."""
    if any(c in text for c in "'\"\\`"):
        raise BadInput(f"{what}: quotes and backslashes are not allowed (it is matched in MLflow searches)")
    return f"'{text}'"


def _find_run(c, experiment_id: str, run_key: str):
    runs = c.search_runs([experiment_id], filter_string=f"tags.`{RUN_KEY_TAG}` = {literal(run_key, 'run key')}",
                         max_results=1)
    return runs[0] if runs else None


def _find_version(c, name: str, run_key: str):
    versions = c.search_model_versions(f"name = {literal(name, 'registry.model_name')} and "
                                       f"tags.`{RUN_KEY_TAG}` = {literal(run_key, 'run key')}")
    return versions[0] if versions else None


def open_run(c, cfg: RunConfig, run_key: str) -> str:
    """The pipeline run's MLflow run, created ``RUNNING`` (tagged live) if new: the training sensor
    ships metrics into it while the gang runs, and registration completes the same run."""
    exp_id = _experiment_id(c, cfg.name)
    run = _find_run(c, exp_id, run_key)
    if run is not None:
        return run.info.run_id
    return c.create_run(exp_id, run_name=run_name(cfg, run_key), tags={RUN_KEY_TAG: run_key, LIVE_TAG: "1"}).info.run_id


def ship(cfg: RunConfig, run_dir: Path, run_key: str, restarts: int | None = None) -> int:
    """Log unshipped metric lines (and the restart count) to the run's MLflow run; returns lines shipped."""
    records, offset = live_metrics.new_records(run_dir)
    if not records and restarts is None:
        return 0
    c = client()
    run_id = open_run(c, cfg, run_key)
    metrics = live_metrics.to_metrics(records)
    for i in range(0, len(metrics), 500):
        c.log_batch(run_id, metrics=metrics[i:i + 500])
    if restarts is not None:
        c.set_tag(run_id, "taxiway.restarts", str(restarts))
    if records:
        live_metrics.mark_shipped(run_dir, offset)
    return len(records)


def _log_run(c, cfg: RunConfig, run_dir: Path, run_key: str, tags: dict[str, str], report: dict[str, Any]) -> str:
    """The MLflow run of this pipeline run, logged in full once. A live run the training sensor
    opened is completed (only metric lines it never shipped are added); an unfinished one whose
    logging had started (an attempt that died while logging) is deleted and logged again."""
    from mlflow.entities import Param, RunTag  # mlflow (~1 s): DAG parse must not pay for it

    exp_id = _experiment_id(c, cfg.name)
    run = _find_run(c, exp_id, run_key)
    if run is not None and run.info.status == "FINISHED":
        return run.info.run_id
    if run is not None and run.data.tags.get(LIVE_TAG) == "1" and LOGGING_TAG not in run.data.tags:
        run_id = run.info.run_id
        records, _ = live_metrics.new_records(run_dir)
    else:
        if run is not None:
            c.delete_run(run.info.run_id)
        run_id = c.create_run(exp_id, run_name=run_name(cfg, run_key), tags={RUN_KEY_TAG: run_key}).info.run_id
        records, _ = live_metrics.new_records(run_dir, start=0)
    c.set_tag(run_id, LOGGING_TAG, "1")
    c.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])
    params = [Param(k, str(v)[:6000]) for k, v in lineage.flatten(cfg.model_dump(mode="json")).items()]
    for i in range(0, len(params), 100):
        c.log_batch(run_id, params=params[i:i + 100])
    metrics = live_metrics.to_metrics(records) + _eval_metrics(report, 0)
    for i in range(0, len(metrics), 500):
        c.log_batch(run_id, metrics=metrics[i:i + 500])
    _log_datasets(c, run_id, cfg, run_dir)
    for path, dest in lineage.artifacts(run_dir):
        c.log_artifact(run_id, str(path), artifact_path=dest)
    served.log_model(c, run_id, RunFolder(run_dir).model)
    if cfg.registry.log_checkpoint and (final := lineage.final_checkpoint(run_dir)) is not None:
        c.log_artifacts(run_id, str(final), artifact_path=CHECKPOINT_ARTIFACT)
    c.set_terminated(run_id)
    return run_id


def _model_version(c, name: str, run_id: str, run_key: str, tags: dict[str, str], description: str):
    from mlflow.exceptions import MlflowException  # mlflow (~1 s): DAG parse must not pay for it

    try:
        c.create_registered_model(name, description="Taxiway models; see version tags for lineage.")
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    mv = _find_version(c, name, run_key)
    if mv is None:
        mv = c.create_model_version(name, source=f"{c.get_run(run_id).info.artifact_uri}/model", run_id=run_id,
                                    tags=tags, description=description)
    return mv


def log(cfg: RunConfig, run_dir: Path, run_key: str, report: dict[str, Any],
        airflow: dict[str, str] | None = None) -> str:
    """Log the run to MLflow in full, as ``register`` does, without a model version (a sweep's members
    that are not registered); returns the MLflow run id. Idempotent per ``run_key``."""
    tags = {**lineage.tags(cfg, Path(run_dir), report, code_version(), airflow or {}), RUN_KEY_TAG: run_key}
    return with_retries(cfg.registry, "log the run", lambda: _log_run(client(), cfg, Path(run_dir), run_key, tags,
                                                                      report))


def register(cfg: RunConfig, run_dir: Path, run_key: str, report: dict[str, Any],
             airflow: dict[str, str] | None = None) -> Registered:
    """Log the run to MLflow (lineage tags from ``report``, the evaluation it passes) and register its
    model as a version of ``registry.model_name``. Idempotent per ``run_key``; moves no alias."""
    run_dir = Path(run_dir)
    tags = {**lineage.tags(cfg, run_dir, report, code_version(), airflow or {}), RUN_KEY_TAG: run_key}
    name = cfg.registry.model_name

    def logged() -> tuple[str, Any]:
        c = client()
        run_id = _log_run(c, cfg, run_dir, run_key, tags, report)
        return run_id, _model_version(c, name, run_id, run_key, tags, version_description(report))

    run_id, mv = with_retries(cfg.registry, "register", logged)
    return Registered(name, str(mv.version), run_id, cfg.name)


def record_reevaluation(reg: RegistryConfig, registered: Registered, run_dir: Path, report: dict[str, Any],
                        attempt: int) -> None:
    """A re-evaluation replaced the report: the run (its eval metrics at step ``attempt``, eval
    artifacts and tags) and the version (tags, description) say so."""
    name, version, run_id = registered.model_name, registered.version, registered.run_id

    def write() -> None:
        c = client()
        c.log_batch(run_id, metrics=_eval_metrics(report, attempt))
        for path, dest in lineage.eval_artifacts(run_dir):
            c.log_artifact(run_id, str(path), artifact_path=dest)
        for key, value in lineage.eval_tags(report).items():
            c.set_model_version_tag(name, version, key, value)
            c.set_tag(run_id, key, value)
        c.update_model_version(name, version, description=version_description(report))

    with_retries(reg, "record the re-evaluation", write)
