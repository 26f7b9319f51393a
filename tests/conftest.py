"""Shared fixtures: an isolated TAXIWAY_HOME, AIRFLOW_HOME and MLflow store per test session.

The environment is set before anything imports Airflow, so the real Airflow (SQLite metadata)
and the real MLflow (SQLite) used by the tests live in a temporary folder.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_HOME = Path(tempfile.mkdtemp(prefix="taxiway-test-"))
os.environ.update({
    "TAXIWAY_HOME": str(_HOME),
    "AIRFLOW_HOME": str(_HOME / "airflow"),
    "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
    "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
    "TAXIWAY_CONFIG": str(REPO / "configs" / "tiny.yaml"),
})
os.environ.pop("MLFLOW_TRACKING_URI", None)
sys.path.insert(0, str(REPO / "plugins"))

TINY = REPO / "configs" / "tiny.yaml"
BIN = Path(sys.executable).parent


@pytest.fixture(scope="session")
def home() -> Path:
    return _HOME


@pytest.fixture(scope="session")
def demo_data(home: Path) -> Path:
    """The tiny config's corpus, written once per session (its paths point here)."""
    from pipelines.demo_data import write_demo_data

    return write_demo_data(home / "demo-data", seed=0, max_files=160).parent


@pytest.fixture(scope="session")
def airflow_db(home: Path) -> Path:
    (home / "airflow").mkdir(parents=True, exist_ok=True)
    subprocess.run([str(BIN / "airflow"), "db", "migrate"], check=True, capture_output=True, env=os.environ)
    return home / "airflow"


def taxiway(*args: str, check: bool = False, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the real ``taxiway`` console script."""
    proc = subprocess.run([str(BIN / "taxiway"), *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=REPO)
    if check and proc.returncode != 0:
        raise AssertionError(f"taxiway {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def pytest_collection_modifyitems(items: list) -> None:
    """Live-Airflow tests last: their session's Airflow then never idles beside the other tests
    (its scheduler and DAG processor would load the machine under timing-sensitive trainer tests)."""
    items.sort(key=lambda item: item.get_closest_marker("live") is not None)


@pytest.fixture(scope="session")
def live_airflow(tmp_path_factory):
    """A live Airflow on loopback (tests/live_airflow.py) with the tiny config's corpus, DAG unpaused."""
    from live_airflow import LiveAirflow

    from pipelines.demo_data import write_demo_data

    live = LiveAirflow(tmp_path_factory.mktemp("live"), extra_env={"TAXIWAY_CONFIG": str(TINY)})
    write_demo_data(live.taxiway_home / "demo-data", seed=0, max_files=160)
    live.start()
    try:
        live.wait_dag("taxiway_train")
        live.unpause("taxiway_train")
        yield live
    finally:
        live.stop()
