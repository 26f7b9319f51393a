"""Shared fixtures. Every test gets its own ``TAXIWAY_HOME`` (run folders, MLflow store, artifacts);
the session shares only inputs that no test changes.

The environment is set before anything imports Airflow, so the real Airflow (SQLite metadata) lives
in this session's temporary folder. Shared, by construction read-only for tests:

- the tiny config's corpus (``demo-data``) and the content-addressed token cache (``cache``: an entry
  is keyed by everything that shapes it and written once, atomically; tests about the cache itself
  use a cache of their own), both linked into each test's home;
- models trained by module fixtures under the session home, which tests copy before changing.

The session's folder is removed when the session ends; pytest keeps the temporary folders of failed
tests only (``tmp_path_retention_policy`` in ``pyproject.toml``).
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import time_scale

REPO = Path(__file__).resolve().parents[1]
_ROOT = Path(tempfile.mkdtemp(prefix="taxiway-test-"))
SESSION_HOME = _ROOT / "session"
atexit.register(shutil.rmtree, _ROOT, True)
os.environ.update({
    "TAXIWAY_HOME": str(SESSION_HOME),
    "AIRFLOW_HOME": str(_ROOT / "airflow"),
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
SHARED = ("demo-data", "cache")  # linked from the session home into every test's home


@pytest.fixture(scope="session")
def session_home() -> Path:
    """Where module and session fixtures build shared inputs (corpus, cache, trained models)."""
    for name in SHARED:
        (SESSION_HOME / name).mkdir(parents=True, exist_ok=True)
    return SESSION_HOME


@pytest.fixture(autouse=True)
def home(session_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's own ``TAXIWAY_HOME``: its runs, its MLflow store (SQLite), its artifacts."""
    own = tmp_path / "taxiway-home"
    own.mkdir()
    for name in SHARED:
        (own / name).symlink_to(session_home / name, target_is_directory=True)
    monkeypatch.setenv("TAXIWAY_HOME", str(own))
    # the shared corpus is a data root of its own, as a shared data volume is in a deployment
    monkeypatch.setenv("TAXIWAY_DATA_ROOTS", os.pathsep.join([str(own), str(session_home / "demo-data")]))
    return own


@pytest.fixture(scope="session")
def demo_data(session_home: Path) -> Path:
    """The tiny config's corpus, written once per session (its paths point to ``$TAXIWAY_HOME``)."""
    from pipelines.demo_data import write_demo_data

    target = session_home / "demo-data"
    if not (target / "manifest.jsonl").exists():
        write_demo_data(target, seed=0, max_files=160, force=True)
    return target


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    airflow_home = Path(os.environ["AIRFLOW_HOME"])
    airflow_home.mkdir(parents=True, exist_ok=True)
    subprocess.run([str(BIN / "airflow"), "db", "migrate"], check=True, capture_output=True, env=os.environ)
    return airflow_home


def taxiway(*args: str, check: bool = False, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the real ``taxiway`` console script."""
    proc = subprocess.run([str(BIN / "taxiway"), *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=REPO)
    if check and proc.returncode != 0:
        raise AssertionError(f"taxiway {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def deployment_config(folder: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> str:
    """A deployment's config file extending the tiny one with ``body`` (YAML), in a config root of its
    own: how a test sets what only the deployment may (the gate, the registry, limits; docs/security.md)."""
    path = folder / "deployment.yaml"
    path.write_text(f"extends: {TINY}\n{body}")
    monkeypatch.setenv("TAXIWAY_CONFIG_ROOTS", str(folder))
    return str(path)


def tampered_run(dag, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``dag.test()`` of the tiny config on a copy of the corpus whose first val file no longer
    matches the manifest: a run that fails at preflight (for the failure summary and the runs view).
    Returns the run and the tampered file's name."""
    monkeypatch.setenv("TAXIWAY_DATA_ROOTS", f"{os.environ['TAXIWAY_DATA_ROOTS']}{os.pathsep}{tmp_path}")
    data = tmp_path / "data"
    shutil.copytree(home / "demo-data", data)
    victim = sorted((data / "val").iterdir())[0]
    victim.write_bytes(victim.read_bytes() + b"\n# tampered\n")
    run = dag.test(run_conf={"config": str(TINY), "data": {"train": str(data / "train"), "val": str(data / "val"),
                                                           "manifest": str(data / "manifest.jsonl")}})
    return run, victim.name


LIVE_MODULES = "test_live_"  # the modules of tests against a live Airflow (marked ``live``)
# the longest modules first (pytest --durations=0, 2026-12-02, seconds per module): the live ones (conf 722,
# cancel 548, Celery 488, refresh 234, sweep 220, UI 113), then the longest others (registry 630, e2e 358,
# gang 326, refresh DAG 274, FSDP 129, CLI 102, e2e sweep 100), so no long module starts last and runs alone
LIVE_ORDER = ("test_live_conf.py", "test_live_cancel.py", "test_live_celery.py", "test_live_refresh.py",
              "test_live_sweep.py", "test_live_ui.py")
LONG_ORDER = ("test_registry.py", "test_e2e_dag.py", "test_gang.py", "test_refresh_dag.py", "test_trainer_fsdp.py",
              "test_cli.py", "test_e2e_sweep.py")


def run_note(dag_id: str, run_id: str) -> str | None:
    """A DAG run's note as the metadata database holds it (set by a callback's own session)."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        return session.scalar(select(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id)).note


def _rank(item: pytest.Item) -> int:
    order = LIVE_ORDER + LONG_ORDER
    return order.index(item.path.name) if item.path.name in order else len(order)


def pytest_configure(config: pytest.Config) -> None:
    """The controller measures how slow this machine is (tests/time_scale.py) before any worker
    starts; the workers inherit the factor through the environment. A factor set by hand wins.
    Likewise the folder of the session's own PostgreSQL and Redis (tests/services.py), started by
    the first test that needs one, so that all workers share them."""
    import services

    if not hasattr(config, "workerinput"):
        if time_scale.ENV not in os.environ:
            os.environ[time_scale.ENV] = f"{time_scale.measure():.2f}"
        services.session_dir()


def pytest_report_header(config: pytest.Config) -> str:
    return f"time limits scaled by {time_scale.factor():.2f} ({time_scale.ENV}: this machine against the fast VM)"


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    """Start the longest chains first when distributed, the live ones last when serial; scale each
    test's time limit (pytest-timeout's mark, or ``--timeout``) by the machine's factor.

    Under pytest-xdist (``make test`` runs ``-n 3``, scheduled by ``pytest_xdist_make_scheduler``
    below) each module is a work unit; the live modules are the longest, so they go out first,
    longest first, each to its own worker, then the longest other modules, and the rest (in random
    order) fill the workers after them. Run serially, live tests go last instead: their session's
    Airflow would otherwise idle beside every other test."""
    for item in items:
        live = item.get_closest_marker("live") is not None
        assert live == item.path.name.startswith(LIVE_MODULES), f"{item.nodeid}: live tests go in {LIVE_MODULES}*.py"
    distributed = config.getoption("dist", "no") != "no" or bool(os.environ.get("PYTEST_XDIST_WORKER"))
    items.sort(key=lambda item: ((item.get_closest_marker("live") is not None) != distributed, _rank(item)))
    default = config.getoption("timeout", None)
    for item in items:
        mark = item.get_closest_marker("timeout")
        limit = mark.args[0] if mark and mark.args else default
        if limit:
            item.add_marker(pytest.mark.timeout(time_scale.scaled(float(limit))), append=False)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """One work unit per module, so a module's fixtures (trained models, a live deployment) are
    built once per module; units go out in collection order. A worker's live modules share its
    session's live Airflow (``live_airflow``); the live Airflow's tests span about 20 minutes of
    mostly waiting, so spread over workers they no longer make one chain longer than the rest."""
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return nodeid.split("::", 1)[0]

    config.option.loadscopereorder = False  # keep the collection order: the live units first
    return ModuleScheduling(config, log)


@pytest.fixture(scope="session")
def live_airflow(tmp_path_factory):
    """A live Airflow on loopback (tests/live_airflow.py), LocalExecutor on a PostgreSQL database of its
    own, with the tiny config's corpus, DAG unpaused."""
    from live_airflow import LiveAirflow
    from postgres import fresh_db, pg_uri

    from pipelines.demo_data import write_demo_data

    with fresh_db("taxiway_live") as metadata:
        live = LiveAirflow(tmp_path_factory.mktemp("live"), metadata_uri=pg_uri(metadata),
                           extra_env={"TAXIWAY_CONFIG": str(TINY)})
        write_demo_data(live.taxiway_home / "demo-data", seed=0, max_files=160)
        live.start()
        try:
            live.wait_dag("taxiway_train")
            live.unpause("taxiway_train")
            yield live
        finally:
            live.stop()


@pytest.fixture(scope="module")
def tracking_server(tmp_path_factory):
    """A real MLflow tracking server (tests/mlflow_server.py) for one module, which may stop and
    restart it; its database is dropped when the module is done."""
    from mlflow_server import mlflow_server

    with mlflow_server(tmp_path_factory.mktemp("mlflow-server")) as server:
        yield server
