"""The run folder and the cache as code: every path a stage reads or writes in them is named here.

Stages, launchers, the CLI and the Airflow glue ask ``RunFolder(run_dir)`` for a path instead of
joining strings, so the layout below is the whole contract (``docs/architecture.md`` shows it)::

    <run>/
      config.yaml, config.sha256     the RunConfig the run is (its identity)
      preflight/                     report.json, report.md, overlap.png, checks/<check>.json,
                                     plan.json (the shards), shards.json (the shard keys used),
                                     clean/ (decontaminated val split), effective.json
      tokenize/packed.json           link to the packed dataset in the cache
      tokenize/shards/NNNNN.json     the tokenize plan: one shard's tokenizer and file groups each
      parent/                        the parent model's weights when training continues one
      pretrained/                    the Hugging Face folder a run starts from (pretrained), fetched and checked
      train/                         spec.json (the trainer's input), gang.json (gang handle),
                                     gang.lease, gang.canceled, logs/attempt-N/, smoke/,
                                     metrics.shipped.json, scratch of the trainer (stack dumps)
      checkpoints/step-NNNNNNNN/     written by the trainer (see trainer/checkpoint.py)
      status.json, metrics.jsonl, events.jsonl    the trainer's status, curve and event log
      model/                         the exported model (weights + tokenizer files)
      eval/                          report.json, report.md, comparison.png, baseline/ (the downloaded baseline)
      registry.json                  what registration made (MLflow run, model version, alias)
      approval.json                  a person's answer to the approval, from Airflow's human-in-the-loop record
      failure.json                   the first failure's summary (per try): stage, reason, what next
      refresh/plan.json              a refresh's batches: new, re-sent, changed (taxiway_refresh)
      refresh/data/, assembled.json  its dataset (new train files, the fixed val, fresh/ held out)
      refresh/ledger.json            the batches of the version it registered
      tokenize/fresh.json            link to the packed held-out new data (the refresh gate's 2nd set)
      sweep/points.json              a sweep's validated points (taxiway_sweep)
      sweep/members.json             the member run folders and their run keys
      sweep/NN/                      one member: a run folder of its own (config = base + point)
      sweep/ranking.json, ranking.md the members ranked by val bits/byte, failed ones listed

    <cache>/tokenizers/<key>/, tokens/<group key>/, packed/<key>/, models/<name>-v<N>/,
            signatures/<params>/<manifest sha256>.npz, preflight/<shard key>/

Trainer states are the trainer's own contract (``trainer.status.State``), re-exported here.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from trainer.paths import TrainerPaths
from trainer.status import DONE, State

__all__ = ["DONE", "Cache", "RunFolder", "State", "cache_dir", "folder_name", "mlflow_artifact_root", "mlflow_tracking_uri",
           "named_run_dir", "run_dir", "run_folders", "run_key", "runs_root", "safe_name", "taxiway_home"]


@dataclass(frozen=True)
class RunFolder:
    """``<TAXIWAY_HOME>/runs/<dag id>/<run id>-<hash>/`` (``run_dir``), or any folder a CLI user names."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    @classmethod
    def of_gang(cls, gang_handle: Path) -> RunFolder:
        """The run folder a gang handle (``gang``) lies in."""
        return cls(Path(gang_handle).parent.parent)

    # identity ----------------------------------------------------------------------------------
    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def config_sha256(self) -> Path:
        return self.root / "config.sha256"

    # preflight ---------------------------------------------------------------------------------
    @property
    def preflight(self) -> Path:
        return self.root / "preflight"

    @property
    def preflight_report(self) -> Path:
        return self.preflight / "report.json"

    @property
    def preflight_summary(self) -> Path:
        return self.preflight / "report.md"

    @property
    def overlap_plot(self) -> Path:
        return self.preflight / "overlap.png"

    @property
    def preflight_checks(self) -> Path:
        return self.preflight / "checks"

    def preflight_check(self, name: str) -> Path:
        return self.preflight_checks / f"{name}.json"

    @property
    def preflight_plan(self) -> Path:
        """The shards the preflight stage scans (written by its plan step)."""
        return self.preflight / "plan.json"

    @property
    def preflight_shards(self) -> Path:
        """Which cached shard results (keys) the report was built from."""
        return self.preflight / "shards.json"

    @property
    def clean_data(self) -> Path:
        return self.preflight / "clean"

    @property
    def effective_data(self) -> Path:
        return self.preflight / "effective.json"

    # tokenize, parent --------------------------------------------------------------------------
    @property
    def packed_link(self) -> Path:
        return self.root / "tokenize" / "packed.json"

    @property
    def tokenize_shards(self) -> Path:
        return self.root / "tokenize" / "shards"

    @property
    def parent(self) -> Path:
        return self.root / "parent"

    @property
    def pretrained(self) -> Path:
        return self.root / "pretrained"

    # train -------------------------------------------------------------------------------------
    @property
    def train(self) -> Path:
        return self.root / "train"

    @property
    def trainer_spec(self) -> Path:
        return self.train / "spec.json"

    @property
    def gang(self) -> Path:
        return self.train / "gang.json"

    @property
    def gang_lease(self) -> Path:
        return self.train / "gang.lease"

    @property
    def gang_canceled(self) -> Path:
        return self.train / "gang.canceled"

    def attempt_logs(self, attempt: int) -> Path:
        return self.train / "logs" / f"attempt-{attempt}"

    @property
    def metrics_shipped(self) -> Path:
        return self.train / "metrics.shipped.json"

    @property
    def smoke(self) -> Path:
        return self.train / "smoke"

    @property
    def smoke_spec(self) -> Path:
        return self.smoke / "spec.json"

    @property
    def trainer(self) -> TrainerPaths:
        """Where the trainer writes (passed to it in ``spec.json``: it never builds a path itself)."""
        return self._trainer_paths(self.root, scratch=self.train)

    @property
    def smoke_trainer(self) -> TrainerPaths:
        """The smoke test's trainer outputs, apart from the real run's."""
        return self._trainer_paths(self.smoke, scratch=self.smoke)

    @staticmethod
    def _trainer_paths(base: Path, scratch: Path) -> TrainerPaths:
        return TrainerPaths(status=base / "status.json", metrics=base / "metrics.jsonl", events=base / "events.jsonl",
                            checkpoints=base / "checkpoints", export=base / "model", scratch=scratch)

    @property
    def status(self) -> Path:
        return self.trainer.status

    def read_status(self) -> dict[str, Any]:
        """``status.json`` as the trainer last wrote it ({} before it did; writes are atomic)."""
        try:
            return json.loads(self.status.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    @property
    def metrics(self) -> Path:
        return self.trainer.metrics

    @property
    def events(self) -> Path:
        return self.trainer.events

    @property
    def checkpoints(self) -> Path:
        return self.trainer.checkpoints

    @property
    def model(self) -> Path:
        return self.trainer.export

    # evaluate, register ------------------------------------------------------------------------
    @property
    def eval(self) -> Path:
        return self.root / "eval"

    @property
    def eval_report(self) -> Path:
        return self.eval / "report.json"

    @property
    def eval_summary(self) -> Path:
        return self.eval / "report.md"

    @property
    def comparison_plot(self) -> Path:
        return self.eval / "comparison.png"

    @property
    def baseline(self) -> Path:
        return self.eval / "baseline"

    @property
    def registry_record(self) -> Path:
        return self.root / "registry.json"

    @property
    def approval_answer(self) -> Path:
        """A person's answer to the approval, as Airflow's human-in-the-loop record holds it."""
        return self.root / "approval.json"

    @property
    def failure_summary(self) -> Path:
        """What the failure callback wrote when a task of the run failed (the newest failure)."""
        return self.root / "failure.json"

    # refresh -----------------------------------------------------------------------------------
    @property
    def refresh_plan(self) -> Path:
        return self.root / "refresh" / "plan.json"

    @property
    def refresh_data(self) -> Path:
        """The refresh's dataset: new train files, the fixed val files, held-out new files (``fresh/``)."""
        return self.root / "refresh" / "data"

    @property
    def refresh_assembled(self) -> Path:
        return self.root / "refresh" / "assembled.json"

    @property
    def refresh_ledger(self) -> Path:
        return self.root / "refresh" / "ledger.json"

    @property
    def fresh_packed_link(self) -> Path:
        return self.root / "tokenize" / "fresh.json"

    # sweep -------------------------------------------------------------------------------------
    @property
    def sweep(self) -> Path:
        return self.root / "sweep"

    @property
    def sweep_points(self) -> Path:
        return self.sweep / "points.json"

    @property
    def sweep_members(self) -> Path:
        return self.sweep / "members.json"

    def sweep_member(self, index: int) -> Path:
        return self.sweep / f"{index:02d}"

    @property
    def sweep_ranking(self) -> Path:
        return self.sweep / "ranking.json"

    @property
    def sweep_ranking_summary(self) -> Path:
        return self.sweep / "ranking.md"


@dataclass(frozen=True)
class Cache:
    """``<TAXIWAY_HOME>/cache/``: content-addressed, shared by every run (never holds run state)."""

    root: Path

    def tokenizer(self, key: str) -> Path:
        return self.root / "tokenizers" / key

    def tokens(self, key: str) -> Path:
        return self.root / "tokens" / key

    def packed(self, key: str) -> Path:
        return self.root / "packed" / key

    def signatures(self, params: str) -> Path:
        return self.root / "signatures" / params

    def preflight_shard(self, key: str) -> Path:
        """One preflight shard's scan result (``pipelines/preflight/shards.py``)."""
        return self.root / "preflight" / key

    @property
    def models(self) -> Path:
        return self.root / "models"

    @contextmanager
    def building(self, entry: Path) -> Iterator[None]:
        """Held while ``entry`` (one of this cache's folders) is built, so concurrent runs needing the
        same key wait for the first builder and then find the entry, instead of all building it
        (ten concurrent runs built one packed dataset three times). ``flock``: the kernel drops a
        dead builder's lock; lock files live apart, in ``locks/``, never beside the entries."""
        lock = self.root / "locks" / f"{entry.parent.name}-{entry.name}.lock"
        lock.parent.mkdir(parents=True, exist_ok=True)
        with open(lock, "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)


# TAXIWAY_HOME ------------------------------------------------------------------------------------
# <home>/runs/<dag id>/<run id>-<hash>/ (the CLI's: runs/<name>/), <home>/cache/, <home>/mlflow.db,
# <home>/mlartifacts/ (unless TAXIWAY_MLFLOW_ARTIFACTS names object storage; and, for `make`, <home>/airflow/ and <home>/demo-data/)

def taxiway_home() -> Path:
    """``$TAXIWAY_HOME``, default ``./.taxiway``, always absolute (workers may change cwd)."""
    return Path(os.environ.get("TAXIWAY_HOME", ".taxiway")).expanduser().resolve()


def safe_name(text: str, limit: int = 80) -> str:
    """``text`` as a readable folder name (Airflow ids carry ``:`` and ``+``): at most ``limit``
    characters of ``[A-Za-z0-9._-]``, never hidden. Many texts share one: never a folder's identity alone."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text)[:limit].strip("._") or "run"


def folder_name(dag_id: str, run_id: str) -> str:
    """The run's folder relative to the runs root: ``<dag id>/<run id>-<hash of both>``. The DAG id
    and the hash keep two runs apart (``x:1`` and ``x_1`` read the same once made safe, and DAGs share
    run ids): the local gang and its cancel are keyed by the folder, so a shared one lets one run stop
    another's gang. The hash is 64 bits of sha256 over the exact pair: to share a run's folder, another
    pair would need a sha256 second preimage."""
    digest = hashlib.sha256(json.dumps([dag_id, run_id]).encode()).hexdigest()[:16]
    return f"{safe_name(dag_id)}/{safe_name(run_id)}-{digest}"


def runs_root(home: Path | PurePosixPath | None = None) -> Path:
    """Where run folders live: under ``home`` (default ``$TAXIWAY_HOME``; a pod's mount path)."""
    return Path(home if home is not None else taxiway_home()) / "runs"


def run_key(dag_id: str, run_id: str) -> str:
    """An Airflow run's identity in MLflow (the tag ``taxiway.run_key``): its folder name, injective in
    (DAG id, run id) like the folder, and of characters an MLflow search filter takes as they are."""
    return folder_name(dag_id, run_id)


def run_dir(dag_id: str, run_id: str, home: Path | PurePosixPath | None = None) -> Path:
    """The folder of the Airflow run ``run_id`` of ``dag_id``: every task and the runs view compute it."""
    return runs_root(home) / folder_name(dag_id, run_id)


def named_run_dir(name: str, home: Path | PurePosixPath | None = None) -> Path:
    """A run folder the CLI names itself (``<config name>-<config sha256[:12]>``, or ``--run-id``)."""
    return runs_root(home) / safe_name(name, limit=200)


def run_folders(home: Path | None = None) -> list[RunFolder]:
    """Every run folder under the runs root: the CLI's (``runs/<name>/``) and Airflow runs'
    (``runs/<dag id>/<run>/``), told apart by the config every prepared run folder holds."""
    root = runs_root(home)
    config = RunFolder(root).config.name
    return [RunFolder(c.parent) for c in (*root.glob(f"*/{config}"), *root.glob(f"*/*/{config}"))]


def cache_dir() -> Path:
    return taxiway_home() / "cache"


def mlflow_tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI`` when set, else SQLite inside ``TAXIWAY_HOME``."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{taxiway_home() / 'mlflow.db'}"


def mlflow_artifact_root() -> str:
    """Where a database tracking store keeps artifacts: ``$TAXIWAY_MLFLOW_ARTIFACTS`` (the deployment's,
    e.g. ``s3://bucket/mlartifacts``, written with MLflow's boto3), else ``mlartifacts/`` in ``TAXIWAY_HOME``.
    A tracking server ignores it: the server's ``--artifacts-destination`` decides."""
    return (os.environ.get("TAXIWAY_MLFLOW_ARTIFACTS", "").rstrip("/")
            or (taxiway_home() / "mlartifacts").as_uri())
