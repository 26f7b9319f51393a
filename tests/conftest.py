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
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

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
    # the product's own pace, set for dag.test() runs (a live deployment keeps the defaults): a gang's
    # event never sooner than this after its trigger started (triggers/gang.py), the final checkpoint poked,
    # a failed gang relaunched (dag.test() waits out a retry's delay in real time)
    "AIRFLOW__TAXIWAY__MIN_EVENT_DELAY_S": "2",
    "AIRFLOW__TAXIWAY__CHECKPOINT_POKE_S": "1",
    "AIRFLOW__TAXIWAY__GANG_RETRY_DELAY_S": "1",
})
# torch on one thread in every test process and the deployments they start: three xdist workers share two
# cores, and torch's default (a thread per core in each) oversubscribes them, its idle threads spinning
# (make test on one VM: 673 s wall at torch's default of 2 threads, 585 s at 1). A gang sets its own (threads_per_proc).
os.environ.setdefault("OMP_NUM_THREADS", "1")
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


@pytest.fixture(scope="session", autouse=True)
def airflow_db() -> Path:
    """This worker's Airflow metadata database (SQLite): a copy of one the session migrated once, so
    that xdist workers do not each run ``airflow db migrate`` (6 CPU-s). In place before the first
    test: a test that only looks a connection up opens Airflow's engine on the path, and that engine
    kept seeing an empty database after a later copy ("no such table: task_instance")."""
    import services
    from filelock import FileLock

    migrated = services.session_dir() / "airflow-migrated.db"
    with FileLock(f"{migrated}.lock"):
        if not migrated.exists():
            partial = migrated.with_suffix(".partial")
            partial.unlink(missing_ok=True)
            subprocess.run([str(BIN / "airflow"), "db", "migrate"], check=True, capture_output=True,
                           env={**os.environ, "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{partial}"})
            partial.rename(migrated)
    airflow_home = Path(os.environ["AIRFLOW_HOME"])
    airflow_home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(migrated, airflow_home / "airflow.db")
    return airflow_home


def taxiway(*args: str, check: bool = False, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the real ``taxiway`` console script."""
    proc = subprocess.run([str(BIN / "taxiway"), *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=REPO)
    if check and proc.returncode != 0:
        raise AssertionError(f"taxiway {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The ``taxiway`` CLI run in this process (typer's ``CliRunner``): the same exit code, stdout and
    stderr as the console script (``taxiway``), without a new interpreter importing torch and MLflow
    again. Log records go to pytest's ``caplog``, not to stderr."""
    from typer.testing import CliRunner

    from pipelines.cli import app

    result = CliRunner().invoke(app, list(args), env=env)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(["taxiway", *args], result.exit_code, result.stdout, result.stderr)


def deployment_config(folder: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> str:
    """The deployment's config file (``TAXIWAY_CONFIG``) for the rest of the test: the tiny one extended
    with ``body`` (YAML), in a config root of its own. How a test sets what only the deployment may (the
    gate, the registry, limits; docs/security.md); a conf naming it names the deployment's own."""
    path = folder / "deployment.yaml"
    path.write_text(f"extends: {TINY}\n{body}")
    monkeypatch.setenv("TAXIWAY_CONFIG_ROOTS", str(folder))
    monkeypatch.setenv("TAXIWAY_CONFIG", str(path))
    return str(path)


def as_deployment(cfg: Any, folder: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``cfg`` (a RunConfig) as the deployment's own config (``TAXIWAY_CONFIG``): what a test that builds a
    run folder by hand for a task needs, since a task holds its folder's config to the deployment's."""
    path = folder / "deployment.yaml"
    path.write_text(cfg.to_yaml())
    monkeypatch.setenv("TAXIWAY_CONFIG", str(path))
    return path


@contextlib.contextmanager
def in_task(dag_id: str, run_id: str, triggered_by: str | None = None, conf: dict | None = None) -> Iterator[Path]:
    """The Airflow context a task reads its DAG run from, for a task function or operator called outside
    a DAG run; yields that run's folder (where the task derives it)."""
    from airflow.sdk.execution_time.context import set_current_context

    from pipelines import run_folder

    ctx = {"dag": SimpleNamespace(dag_id=dag_id), "run_id": run_id,
           "dag_run": SimpleNamespace(triggering_user_name=triggered_by, conf=conf or {})}
    with set_current_context(ctx):
        yield run_folder.run_dir(dag_id, run_id)


LIVE_MODULES = "test_live_"  # the modules of tests against a live Airflow (marked ``live``)
SPREAD = ("test_live_cancel.py", "test_live_conf.py", "test_live_sweep.py")  # their tests share only live_airflow
# one work unit: the live modules that keep the most training runs going on the shared deployment (approval
# two tests of two side by side, refresh three in a row); on two workers side by side they took each other's slots and
# cores, and starved each other's runs past their clocks
BUSIEST = ("test_live_approval.py", "test_live_refresh.py")
# the longest modules first, so no long module starts last and runs alone (--durations=0 of each tier)
LONGEST_FIRST = ("test_live_approval.py", "test_live_refresh.py", "test_live_kubernetes.py", "test_live_celery.py",
                 "test_live_cancel.py::test_a_cancel_while_deferred", "test_live_ui.py",
                 "test_live_cancel.py", "test_live_sweep.py::test_a_sweep_over_rest",
                 "test_live_standalone.py",
                 "test_registry.py", "test_e2e_dag.py", "test_gang.py", "test_refresh_dag.py", "test_champion_locks.py",
                 "test_trainer_fsdp.py", "test_cli.py")  # modules, or module::test prefixes


def run_note(dag_id: str, run_id: str) -> str | None:
    """A DAG run's note as the metadata database holds it (set by a callback's own session)."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        return session.scalar(select(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id)).note


def pytest_configure(config: pytest.Config) -> None:
    """The folder of the session's own PostgreSQL, Redis and live Airflow (deploy/local/services.py), made
    before any xdist worker starts so that all of them share what the first test to need one starts."""
    import services

    if not hasattr(config, "workerinput"):
        services.session_dir()


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    """Live tests live in their own modules (the live tier selects them by mark); the longest modules
    go first. Under pytest-xdist each module is a work unit (``pytest_xdist_make_scheduler``), so the
    long ones start on their own workers and the rest, in random order, fill the workers after them."""
    for item in items:
        live = item.get_closest_marker("live") is not None
        assert live == item.path.name.startswith(LIVE_MODULES), f"{item.nodeid}: live tests go in {LIVE_MODULES}*.py"
    def rank(item: pytest.Item) -> int:
        name = item.nodeid.rsplit("/", 1)[-1]
        return next((i for i, prefix in enumerate(LONGEST_FIRST) if name.startswith(prefix)), len(LONGEST_FIRST))

    items.sort(key=rank)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """One work unit per module, so a module's fixtures (trained models, the Celery deployment) are
    built once per module; units go out in collection order. The tests of a live module that uses
    nothing but the session's shared deployment (``live_airflow``) are units of their own instead:
    they spend their time waiting on it, and spread over the workers none of them waits behind
    another. The ``BUSIEST`` modules are one unit: one worker runs them one after the other."""
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            name = module.rsplit("/", 1)[-1]
            return nodeid if name in SPREAD else " + ".join(BUSIEST) if name in BUSIEST else module

    config.option.loadscopereorder = False  # keep the collection order: the longest first
    return ModuleScheduling(config, log)


@pytest.fixture(scope="session")
def live_airflow():
    """The live tier's one LocalExecutor deployment (deploy/local/live_airflow.py ``shared_local``), shared by
    every test and xdist worker of the session: each test works in DAG runs and configs of its own."""
    from live_airflow import shared_local

    live = shared_local(TINY)
    yield live
    live.api.close()


@pytest.fixture(scope="session")
def postgres_db():
    """A database of this worker's session on the session's PostgreSQL (deploy/local/postgres.py), dropped at the end."""
    from postgres import fresh_db

    with fresh_db() as name:
        yield name


@pytest.fixture(scope="module")
def tracking_server(tmp_path_factory):
    """A real MLflow tracking server (deploy/local/mlflow_server.py) for one module, which may stop and
    restart it; its database is dropped when the module is done."""
    from mlflow_server import mlflow_server

    with mlflow_server(tmp_path_factory.mktemp("mlflow-server")) as server:
        yield server


@pytest.fixture(scope="module")
def browser():
    """Debian's chromium driven by Playwright (pinned; no browser download), for the browser tests. An
    ``expect`` waits up to 60 s, as a page's actions do (``set_default_timeout``): on a busy 2-core machine
    the UI's pages take seconds to load their data, past ``expect``'s default of 5 s."""
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=60_000)

    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is not installed (make browser installs it: apt-get install chromium)"
    with sync_playwright() as pw:
        launched = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-dev-shm-usage"])
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    """Where a browser test saves screenshots: ``TAXIWAY_SCREENSHOTS`` (the docs' are made with
    ``TAXIWAY_SCREENSHOTS=docs/screenshots``), else the test's temporary folder."""
    out = Path(os.environ.get("TAXIWAY_SCREENSHOTS") or tmp_path)
    out = out if out.is_absolute() else REPO / out
    out.mkdir(parents=True, exist_ok=True)
    return out


def sign_in(page, url: str, password: str, user: str = "admin") -> None:
    """Log in on the Airflow UI's login page as one of the live deployment's users (its admin by default)."""
    page.goto(f"{url}/")
    page.locator("input[name=username]").fill(user)
    page.locator("input[name=password]").fill(password)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(lambda u: "/auth/" not in u)


@pytest.fixture(scope="module")
def refresh_dag(airflow_db, demo_data):
    """taxiway_refresh as the DAG processor parses it, for the refresh tests' ``dag.test()`` runs."""
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(REPO / "dags")).dags["taxiway_refresh"]


@pytest.fixture(scope="module")
def base_run(session_home: Path, demo_data: Path) -> Path:
    """The champion-to-be of the refresh tests, trained once per session (before any test's own home exists)."""
    from refresh_batches import CHAMPION_STEPS
    from trained_models import make_run

    return make_run(session_home, "refresh-base", CHAMPION_STEPS, preflight=True)
