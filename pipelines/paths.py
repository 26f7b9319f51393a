"""Where Taxiway keeps things: everything local lives under ``TAXIWAY_HOME``."""

from __future__ import annotations

import os
import re
from pathlib import Path


def taxiway_home() -> Path:
    """``$TAXIWAY_HOME``, default ``./.taxiway``, always absolute (workers may change cwd)."""
    return Path(os.environ.get("TAXIWAY_HOME", ".taxiway")).expanduser().resolve()


def safe_run_id(run_id: str) -> str:
    """A run id usable as a folder name (Airflow ids carry ``:`` and ``+``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", run_id).strip("._") or "run"


def run_dir(run_id: str) -> Path:
    return taxiway_home() / "runs" / safe_run_id(run_id)


def cache_dir() -> Path:
    return taxiway_home() / "cache"


def mlflow_tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI`` when set, else SQLite inside ``TAXIWAY_HOME``."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{taxiway_home() / 'mlflow.db'}"


def mlflow_artifact_root() -> str:
    return (taxiway_home() / "mlartifacts").as_uri()
