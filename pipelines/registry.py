"""MLflow: baselines in, registered model versions with lineage out.

One MLflow run per pipeline run (experiment = config name), keyed by the Airflow run id (tag
``taxiway.run_key``) so a retried register task finds its own earlier run and version instead
of creating a second: every step checks what exists before it writes, which also makes the
whole registration safe to retry after a transient MLflow failure. Who becomes ``champion`` is
decided in ``pipelines.promotion``, under a lock.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pipelines import lineage, manifest
from pipelines.config import RegistryConfig, RunConfig
from pipelines.errors import BadInput, Transient
from pipelines.run_folder import Cache, RunFolder, cache_dir, mlflow_artifact_root, mlflow_tracking_uri

log = logging.getLogger("taxiway.registry")

RUN_KEY_TAG = "taxiway.run_key"
LIVE_TAG = "taxiway.live"         # opened by the training sensor to ship metrics while the gang runs
LOGGING_TAG = "taxiway.logging"   # registration started logging into this run
T = TypeVar("T")


class ModelNotFound(BadInput, LookupError):
    """A models:/ URI names no version, or the version's files are not a Taxiway model."""


class RegistryUnavailable(Transient):
    """MLflow could not be reached (or kept failing transiently) after every retry."""


@dataclass(frozen=True)
class Baseline:
    kind: str            # champion | parent | uri
    uri: str
    name: str
    version: str
    folder: Path         # downloaded model folder (model.safetensors, model.json, tokenizer.json)
    weights_sha256: str | None


# --- connecting, with retries for what is transient -------------------------------------------

def redacted(uri: str) -> str:
    """The tracking URI without a password, fit for logs and error messages."""
    if "://" in uri and "@" in uri.split("://", 1)[1].split("/", 1)[0]:
        scheme, rest = uri.split("://", 1)
        auth, _, host = rest.partition("@")
        return f"{scheme}://{auth.split(':', 1)[0]}:***@{host}" if ":" in auth else uri
    return uri


def _is_database(uri: str) -> bool:
    return uri.split(":", 1)[0].split("+", 1)[0] in ("sqlite", "postgresql", "mysql", "mssql")


def transient(exc: BaseException) -> bool:
    """Worth retrying: the store was unreachable, busy, or rate limiting — not a bad request."""
    import requests
    import sqlalchemy.exc
    from mlflow.exceptions import MlflowException

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, (ConnectionError, TimeoutError, requests.ConnectionError, requests.Timeout,
                             sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError)):
            return True
        if isinstance(seen, MlflowException):
            if seen.error_code in ("TEMPORARILY_UNAVAILABLE", "REQUEST_LIMIT_EXCEEDED"):
                return True
            if seen.message.startswith("API request to") and "failed with exception" in seen.message:
                return True  # the REST client ran out of its own retries on a connection error
        seen = seen.__cause__ or seen.__context__
    return False


def with_retries(reg: RegistryConfig, what: str, fn: Callable[[], T]) -> T:
    """``fn()``, retried with doubling back-off while it fails transiently; then a clear error."""
    delay = reg.retry_backoff_s
    for attempt in range(reg.retries + 1):
        try:
            return fn()
        except Exception as exc:
            if not transient(exc):
                raise
            brief = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
            if attempt == reg.retries:
                raise RegistryUnavailable(
                    f"MLflow at {redacted(mlflow_tracking_uri())} unavailable: {what} failed {attempt + 1} times "
                    f"(registry.retries={reg.retries}); last error: {brief}") from None
            log.warning("%s: MLflow unavailable (%s); retry %d/%d in %.1f s", what, brief, attempt + 1,
                        reg.retries, delay)
            time.sleep(delay)
            delay = min(delay * 2, 60.0)
    raise AssertionError("unreachable")


def _ping(uri: str) -> None:
    """Fail fast (and transiently) when the store is down, instead of waiting out MLflow's own HTTP retries."""
    if uri.startswith("sqlite:"):
        return
    if _is_database(uri):
        import sqlalchemy

        engine = sqlalchemy.create_engine(uri, connect_args={"connect_timeout": 10}, poolclass=sqlalchemy.NullPool)
        try:
            with engine.connect():
                pass
        finally:
            engine.dispose()
    elif uri.startswith(("http://", "https://")):
        import requests

        response = requests.get(f"{uri.rstrip('/')}/health", timeout=10)
        if response.status_code >= 500 or response.status_code == 429:
            raise ConnectionError(f"{redacted(uri)}/health answered HTTP {response.status_code}")


def client():
    """A client bound to Taxiway's tracking URI, without touching MLflow's process-wide default;
    raises a transient error at once when the store is unreachable."""
    from mlflow import MlflowClient

    uri = mlflow_tracking_uri()
    _ping(uri)
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


# --- reading models -------------------------------------------------------------------------------

def parse_models_uri(uri: str) -> tuple[str, str | None, str | None]:
    """``models:/NAME/VERSION`` or ``models:/NAME@ALIAS`` → (name, version, alias)."""
    if not uri.startswith("models:/"):
        raise BadInput(f"{uri!r}: expected models:/NAME/VERSION or models:/NAME@ALIAS")
    body = uri[len("models:/"):]
    if "@" in body:
        name, alias = body.split("@", 1)
        return name, None, alias
    name, _, version = body.partition("/")
    if not name or not version:
        raise BadInput(f"{uri!r}: expected models:/NAME/VERSION or models:/NAME@ALIAS")
    return name, version, None


def resolve_version(uri: str, reg: RegistryConfig | None = None):
    """The ModelVersion a models:/ URI names; a clear error when it does not exist."""
    from mlflow.exceptions import MlflowException

    reg = reg or RegistryConfig()
    name, version, alias = parse_models_uri(uri)

    def get():
        c = client()
        return c.get_model_version_by_alias(name, alias) if alias else c.get_model_version(name, version)

    try:
        return with_retries(reg, f"resolve {uri}", get)
    except MlflowException as exc:
        raise ModelNotFound(f"{uri}: no such model version ({exc.message})") from None


def download(mv, dest: Path, reg: RegistryConfig | None = None) -> Path:
    """The version's model folder, ``dest/<name>-v<version>``: downloaded once into a staging
    folder and renamed, so a retried task reuses a complete copy and never a partial one. The
    weights are checked against the sha256 recorded at registration."""
    import mlflow
    from mlflow.exceptions import MlflowException

    final = dest / f"{mv.name}-v{mv.version}"
    if (final / "model.safetensors").is_file():
        return final
    dest.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".download.", dir=dest))
    where = f"models:/{mv.name}/{mv.version}"
    try:
        try:
            got = Path(with_retries(reg or RegistryConfig(), f"download {where}", lambda: mlflow.artifacts.download_artifacts(
                artifact_uri=mv.source, dst_path=str(tmp), tracking_uri=mlflow_tracking_uri())))
        except (MlflowException, OSError) as exc:
            raise Transient(f"{where}: its files at {mv.source} cannot be downloaded ({exc})") from None
        if not (got / "model.safetensors").is_file():
            raise ModelNotFound(f"{where}: no model.safetensors in {mv.source}")
        expected = (mv.tags or {}).get(lineage.WEIGHTS_TAG)
        if expected and manifest.sha256_file(got / "model.safetensors") != expected:
            raise ModelNotFound(f"{where}: model.safetensors at {mv.source} does not match the sha256 recorded "
                              f"at registration ({expected[:12]}…); the stored copy is corrupt")
        os.rename(got, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def fetch_model(uri: str, reg: RegistryConfig | None = None) -> tuple[Path, str | None]:
    """A model folder to load, and the weights sha256 recorded at registration: a models:/ URI is
    downloaded once into ``$TAXIWAY_HOME/cache/models``; an existing folder is used as it is."""
    if not uri.startswith("models:/") and Path(uri).is_dir():
        return Path(uri), None
    mv = resolve_version(uri, reg)
    return download(mv, Cache(cache_dir()).models, reg), (mv.tags or {}).get(lineage.WEIGHTS_TAG)


def resolve_baseline(cfg: RunConfig, dest: Path, choice: str | None = None) -> Baseline | None:
    """The model to beat (``choice`` overrides ``eval.baseline``), or None: compare with the floor
    (``floor``, or ``champion`` while no model holds the alias)."""
    from pipelines import promotion

    choice = choice or cfg.eval.baseline
    reg = cfg.registry
    if choice == "floor":
        return None
    if choice == "champion":
        mv = with_retries(reg, "read the champion", lambda: promotion.current_champion(
            client(), reg.model_name, reg.champion_alias))
        if mv is None:
            return None
        kind, uri = "champion", f"models:/{reg.model_name}@{reg.champion_alias}"
    else:
        uri = cfg.parent if choice == "parent" else choice
        if not uri:
            raise BadInput("eval.baseline: 'parent' needs a parent model (config field parent)")
        mv = resolve_version(uri, reg)
        kind = "parent" if choice == "parent" else "uri"
        if kind == "uri" and mv.name == reg.model_name and reg.champion_alias in (mv.aliases or []):
            kind = "champion"  # e.g. the pinned champion a re-evaluation compares against
    return Baseline(kind, uri, mv.name, str(mv.version), download(mv, dest, reg),
                    (mv.tags or {}).get(lineage.WEIGHTS_TAG))


# --- writing a run and its model version ------------------------------------------------------------

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
    from mlflow.exceptions import MlflowException

    exp = c.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    server = mlflow_tracking_uri().startswith(("http://", "https://", "databricks"))
    try:  # a server picks its own artifact store; a database store keeps artifacts under TAXIWAY_HOME
        return c.create_experiment(name, artifact_location=None if server else f"{mlflow_artifact_root()}/{name}")
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        return c.get_experiment_by_name(name).experiment_id  # another run created it meanwhile


def _eval_metrics(report: dict[str, Any], step: int):
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    out = [Metric(f"eval.{who}.{key}", float(report[who][key]), now, step)
           for who in ("candidate", "baseline") for key in ("loss", "bits_per_byte", "perplexity")]
    gate = report["gate"]
    out += [Metric(f"eval.{key}", float(gate[key]), now, step) for key in ("improvement_bpb", "lower_bpb", "upper_bpb")]
    return out


def _log_datasets(c, run_id: str, cfg: RunConfig, run_dir: Path) -> None:
    """The data as MLflow dataset inputs (what ``mlflow.log_input`` logs, bound to this client)."""
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.entities import DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    inputs = []
    for ref in lineage.datasets(cfg, run_dir):
        with warnings.catch_warnings():  # MLflow registers its local-file source class twice and says so
            warnings.filterwarnings("ignore", message="The specified dataset source can be interpreted")
            source = resolve_dataset_source(ref.source)
        dataset = MetaDataset(source, name=ref.name, digest=ref.digest)
        tags = [InputTag(k, v) for k, v in ref.tags.items()] + [InputTag(MLFLOW_DATASET_CONTEXT, ref.context)]
        inputs.append(DatasetInput(dataset._to_mlflow_entity(), tags))
    c.log_inputs(run_id, datasets=inputs)


def _find_run(c, experiment_id: str, run_key: str):
    runs = c.search_runs([experiment_id], filter_string=f"tags.`{RUN_KEY_TAG}` = '{run_key}'", max_results=1)
    return runs[0] if runs else None


def _find_version(c, name: str, run_key: str):
    versions = c.search_model_versions(f"name = '{name}' and tags.`{RUN_KEY_TAG}` = '{run_key}'")
    return versions[0] if versions else None


def open_run(c, cfg: RunConfig, run_key: str) -> str:
    """The pipeline run's MLflow run, created ``RUNNING`` (tagged live) if new: the training sensor
    ships metrics into it while the gang runs, and registration completes the same run."""
    exp_id = _experiment_id(c, cfg.name)
    run = _find_run(c, exp_id, run_key)
    if run is not None:
        return run.info.run_id
    return c.create_run(exp_id, run_name=run_key, tags={RUN_KEY_TAG: run_key, LIVE_TAG: "1"}).info.run_id


def _log_run(c, cfg: RunConfig, run_dir: Path, run_key: str, tags: dict[str, str], report: dict[str, Any]) -> str:
    """The MLflow run of this pipeline run, logged in full once. A live run the training sensor
    opened is completed (only metric lines it never shipped are added); an unfinished one whose
    logging had started (an attempt that died while logging) is deleted and logged again."""
    from mlflow.entities import Param, RunTag

    from pipelines import live_metrics

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
        run_id = c.create_run(exp_id, run_name=run_key).info.run_id
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
    c.log_artifacts(run_id, str(RunFolder(run_dir).model), artifact_path="model")
    c.set_terminated(run_id)
    return run_id


def _model_version(c, name: str, run_id: str, run_key: str, tags: dict[str, str], description: str):
    from mlflow.exceptions import MlflowException

    try:
        c.create_registered_model(name, description="Taxiway GPT models; see version tags for lineage.")
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    mv = _find_version(c, name, run_key)
    if mv is None:
        mv = c.create_model_version(name, source=f"{c.get_run(run_id).info.artifact_uri}/model", run_id=run_id,
                                    tags=tags, description=description[:4000])
    return mv


def register(cfg: RunConfig, run_dir: Path, run_key: str, airflow: dict[str, str] | None = None,
             reevaluate: Callable[[str], dict[str, Any]] | None = None) -> dict[str, Any]:
    """Log the run to MLflow, register its model, and move ``champion`` or ``challenger`` to it.

    Idempotent per ``run_key``. ``reevaluate(baseline)`` re-runs the evaluation against another
    baseline (a models:/ URI, or ``floor``) when the champion moved while this run was evaluated.
    """
    from pipelines import promotion

    run_dir = Path(run_dir)
    report = json.loads(RunFolder(run_dir).eval_report.read_text())
    tags = {**lineage.tags(cfg, run_dir, report, code_version(), airflow or {}), RUN_KEY_TAG: run_key}
    name = cfg.registry.model_name

    def logged() -> tuple[str, Any]:
        c = client()
        run_id = _log_run(c, cfg, run_dir, run_key, tags, report)
        return run_id, _model_version(c, name, run_id, run_key, tags, report["summary"])

    run_id, mv = with_retries(cfg.registry, "register", logged)

    def updated(new: dict[str, Any], attempt: int) -> None:
        """A re-evaluation replaced the report: the run and the version say so."""
        def write() -> None:
            c = client()
            c.log_batch(run_id, metrics=_eval_metrics(new, attempt))
            for path, dest in lineage.eval_artifacts(run_dir):
                c.log_artifact(run_id, str(path), artifact_path=dest)
            for key, value in lineage.eval_tags(new).items():
                c.set_model_version_tag(name, mv.version, key, value)
                c.set_tag(run_id, key, value)
            c.update_model_version(name, mv.version, description=new["summary"][:4000])

        with_retries(cfg.registry, "record the re-evaluation", write)

    def reeval(baseline: str, attempt: int) -> dict[str, Any]:
        new = reevaluate(baseline)
        updated(new, attempt)
        return new

    outcome = promotion.promote(cfg.registry, str(mv.version), report, reeval if reevaluate else None)
    return {"model_name": name, "version": str(mv.version), "alias": outcome.alias, "reason": outcome.reason,
            "run_id": run_id, "experiment": cfg.name, "uri": f"models:/{name}/{mv.version}"}
