"""A live Airflow for tests: api-server, scheduler, dag-processor and triggerer as real processes.

Triggers run in the triggerer, tasks in LocalExecutor workers — or, with a ``CeleryShape``, in
Celery workers fed through Redis with the metadata on PostgreSQL, the production shape. REST calls
go over loopback with a JWT from the simple auth manager: what a user meets, unlike ``dag.test()``
(triggers inline).
Each ``LiveAirflow`` owns its AIRFLOW_HOME, TAXIWAY_HOME and ports, and stops every process it
started by process group. The live tier's LocalExecutor deployment is one for the whole session, its
xdist workers included (``shared_local``): started by the first test that needs it, found again by the
others from its ``state()``, stopped when the session ends (deploy/local/services.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from pipelines.launch.local import free_port  # the tests' servers take their ports as the gang does

REPO = Path(__file__).resolve().parents[2]
# a credential planted in every live deployment's environment, as a real deployment's would be: no file
# the deployment writes may hold it, whatever a trigger sends (tests/test_live_conf.py)
PLANTED_SECRET = "postgresql://airflow:" + secrets.token_hex(8) + "@db/airflow"
BIN = Path(sys.executable).parent
COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
# SimpleAuthManager's users of every live deployment: the admin, and two with the ``user`` role (trigger runs,
# edit XComs and task states, answer approvals), as the people the trust tests play (docs/security.md)
USERS = {"admin": "admin", "ada": "user", "tom": "user"}
# the owned fields the session's shared deployment lets its tests' triggers set, so each test keeps to a
# registered model and an approval policy of its own, as a deployment shared by teams would allow
SHARED_MAY_SET = ("registry.model_name", "registry.lock_timeout_s", "registry.approval", "registry.approval_timeout_s",
                  "registry.approval_reminder_s", "registry.approvers", "alerts.webhooks", "compute.kubernetes.labels")
TERMINAL = {"success", "failed"}


def answers(url: str, procs: dict[str, tuple[subprocess.Popen, Path]]) -> bool:
    """``url`` answers 200 while every server process (name → process, its log) still runs; one that exited
    fails the wait at once, with its log's tail."""
    for name, (proc, log) in procs.items():
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def wait_for(what: str, probe: Callable[[], Any], timeout_s: float, every_s: float = 0.5,
             explain: Callable[[], str] | None = None) -> Any:
    """Poll ``probe`` until it returns something truthy; fail naming ``what`` (and what ``explain``
    says about the state it was stuck in) after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        if value := probe():
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}"
                                 + (f"\n{explain()}" if explain else ""))
        time.sleep(every_s)


def production_config() -> dict[str, str]:
    """The ``config:`` section of the production Helm values (deploy/airflow-values.yaml) as the
    environment variables the chart would render from it, so the Celery shape runs with it."""
    values = yaml.safe_load((REPO / "deploy" / "airflow-values.yaml").read_text())
    return {f"AIRFLOW__{section.upper()}__{key.upper()}": str(value)
            for section, options in values.get("config", {}).items() for key, value in options.items()}


@dataclass(frozen=True)
class CeleryShape:
    """The distributed deployment: metadata on PostgreSQL (``metadata_uri``, also the Celery result
    backend), Redis as the broker, ``workers`` Celery workers of ``concurrency`` slots each, each
    listening on ``queues`` (docs/deploy.md: the deployment's ``gpu_queue`` needs a worker of its own)."""

    metadata_uri: str
    broker_url: str
    workers: int = 2
    concurrency: int = 4
    queues: tuple[str, ...] = ("default",)

    def env(self) -> dict[str, str]:
        return {"AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.metadata_uri,
                "AIRFLOW__CELERY__BROKER_URL": self.broker_url,
                "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + self.metadata_uri,
                "AIRFLOW__CELERY__WORKER_CONCURRENCY": str(self.concurrency),
                # a worker that died is noticed by its task's missing heartbeats: soon, not after 5 min
                "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "30",
                "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
                **production_config()}

    def components(self) -> list[tuple[str, list[str], dict[str, str]]]:
        """Each worker with its own Celery node name and log server port (they share one host)."""
        return [(f"celery-worker-{i}", ["celery", "worker", "--celery-hostname", f"w{i}@%h", "--without-mingle",
                                        "--without-gossip", "--queues", ",".join(self.queues)],
                 {"AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port())}) for i in range(1, self.workers + 1)]


class LiveAirflow:
    """Start with ``start()``, stop with ``stop()``; ``api`` is an authenticated REST client."""

    def __init__(self, root: Path, *, metadata_uri: str | None = None, extra_env: dict[str, str] | None = None,
                 celery: CeleryShape | None = None, detached: bool = False, ports: dict[str, int] | None = None,
                 secrets_: dict[str, str] | None = None) -> None:
        """``metadata_uri``: the LocalExecutor shape's metadata database (a ``CeleryShape`` names its own).
        ``detached``: its processes outlive the test process that started them (a session's shared
        deployment; stopped by ``stop_state``). ``ports`` and ``secrets_``: those of a running one
        (``state()``), to reach it from another process (``attach``)."""
        if (metadata_uri is None) == (celery is None):
            raise ValueError("name the metadata database: metadata_uri for the LocalExecutor shape, or a CeleryShape")
        ports = ports or {"api": free_port(), "worker_log": free_port(), "trigger_log": free_port()}
        secrets_ = secrets_ or {"password": secrets.token_urlsafe(12), "jwt": secrets.token_hex(32)}
        self.init = {"root": str(root), "metadata_uri": metadata_uri, "extra_env": extra_env or {},
                     "ports": ports, "secrets": secrets_}
        self.detached = detached
        self.root = root
        self.home = root / "airflow"
        self.taxiway_home = root / "taxiway"
        self.config_root = root / "configs"  # the deployment's own config files beside the repo's
        self.port = ports["api"]
        self.url = f"http://127.0.0.1:{self.port}"
        self.password = secrets_["password"]
        self.procs: dict[str, subprocess.Popen] = {}
        self.api: httpx.Client | None = None
        self._watcher: threading.Thread | None = None  # see restarting()
        self._restart_into: list[str] | None = None
        self._launching, self._stopping = threading.Lock(), threading.Event()
        self.env = {
            **os.environ,
            "AIRFLOW_HOME": str(self.home),
            "TAXIWAY_HOME": str(self.taxiway_home),
            "TAXIWAY_CONFIG_ROOTS": str(self.config_root),
            "SECRET_DB_URL": PLANTED_SECRET,
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "taxiway_airflow.executors.LocalExecutor",  # Airflow's, preloaded
            "AIRFLOW__CORE__PARALLELISM": "8",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(f"{u}:{role}" for u, role in USERS.items()),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(self.home / "passwords.json"),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets_["jwt"],
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(ports["worker_log"]),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(ports["trigger_log"]),
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "600",  # the DAG file does not change here
            "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
            # Airflow's own pace, set for tests: a user's cancel reaches a running task at its supervisor's
            # next heartbeat, a deferred task's trigger at the triggerer's next loop; the defaults (5 s)
            # only make each test wait longer for the same events
            "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.5",
            "AIRFLOW__SCHEDULER__JOB_HEARTBEAT_SEC": "2",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
            "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "2",
            "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": "2",
            "PYTHONUNBUFFERED": "1",
            # what a deployment gives its workers so failure callbacks can set a run's note (REST)
            "TAXIWAY_AIRFLOW_URL": self.url, "TAXIWAY_AIRFLOW_USERNAME": "admin",
            "TAXIWAY_AIRFLOW_PASSWORD": self.password,
            # PostgreSQL, not SQLite: under make test's load the scheduler held SQLite's one write lock for
            # tens of seconds (it exited on "database is locked" at pysqlite's 5 s busy timeout; at 60 s
            # the api-server's trigger calls outlasted the client's 30 s read timeout instead)
            **(celery.env() if celery else {"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": metadata_uri}),
        }
        self.env.pop("MLFLOW_TRACKING_URI", None)  # the deployment's own store unless extra_env names one
        for paced in ("AIRFLOW__TAXIWAY__MIN_EVENT_DELAY_S", "AIRFLOW__TAXIWAY__CHECKPOINT_POKE_S"):
            self.env.pop(paced, None)  # dag.test()'s pace (conftest); a live deployment keeps the product's
        self.env.update(extra_env or {})
        self.components = [(name, [name], {}) for name in COMPONENTS] + (celery.components() if celery else [])

    # lifecycle ---------------------------------------------------------------------------------
    def start(self, timeout_s: float = 240) -> LiveAirflow:
        self.home.mkdir(parents=True, exist_ok=True)
        self.taxiway_home.mkdir(parents=True, exist_ok=True)
        self.config_root.mkdir(parents=True, exist_ok=True)
        (self.home / "passwords.json").write_text(json.dumps({user: self.password for user in USERS}))
        migrate = subprocess.run([str(BIN / "airflow"), "db", "migrate"], env=self.env, capture_output=True,
                                 text=True, timeout=300)
        if migrate.returncode:
            raise RuntimeError(f"airflow db migrate failed:\n{migrate.stdout[-2000:]}\n{migrate.stderr[-2000:]}")
        for name, _, _ in self.components:
            self.launch(name)
        wait_for("the api-server", self._healthy, timeout_s, every_s=1)
        return self.attach()

    @contextlib.contextmanager
    def serving(self, dag_id: str) -> Iterator[LiveAirflow]:
        """Started, with ``dag_id`` parsed and unpaused; stopped on the way out, whatever happened."""
        self.start()
        try:
            self.wait_dag(dag_id)
            self.unpause(dag_id)
            yield self
        finally:
            self.stop()

    def attach(self) -> LiveAirflow:
        """The REST client, for the process that started the deployment or another one (``state()``)."""
        self.api = _RetryingClient(self.log_path("api-server"), base_url=self.url, timeout=30,
                                   headers={"Authorization": f"Bearer {self.token()}"})
        return self

    def state(self) -> dict[str, Any]:
        """What another process needs to reach this deployment (``from_state``) or to stop it (``stop_state``)."""
        return {**self.init, "pids": {name: proc.pid for name, proc in self.procs.items()}}

    def as_deployment(self, monkeypatch) -> None:
        """This process acts as the deployment's own tasks do on its registry and runs: its
        ``TAXIWAY_HOME``, and its object storage (the S3 keys, MLflow's artifact root) where it has one."""
        monkeypatch.setenv("TAXIWAY_HOME", str(self.taxiway_home))
        for key, value in self.init["extra_env"].items():
            if key.startswith("AWS_") or key == "TAXIWAY_MLFLOW_ARTIFACTS":
                monkeypatch.setenv(key, value)

    @property
    def bucket(self) -> str | None:
        """The deployment's S3 bucket (``shared_local``'s), if it has one."""
        artifacts = self.init["extra_env"].get("TAXIWAY_MLFLOW_ARTIFACTS", "")
        return artifacts.removeprefix("s3://").split("/")[0] if artifacts.startswith("s3://") else None

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> LiveAirflow:
        return cls(Path(state["root"]), metadata_uri=state["metadata_uri"], extra_env=state["extra_env"],
                   ports=state["ports"], secrets_=state["secrets"]).attach()

    def stop(self, grace_s: float = 20) -> None:
        """SIGTERM every component's process group, SIGKILL what is left after ``grace_s``; then stop
        any training gang of this home that a failed test left behind."""
        if self.api is not None:
            self.api.close()
        self._stopping.set()
        if self._watcher is not None:
            self._watcher.join()
        for proc in self.procs.values():
            signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
        stop_gangs(self.taxiway_home)

    def launch(self, name: str) -> None:
        """Start component ``name`` (again) in a process group of its own."""
        argv, env = next((argv, env) for n, argv, env in self.components if n == name)
        with open(self.log_path(name), "ab") as log:
            self.procs[name] = subprocess.Popen([str(BIN / "airflow"), *argv], env={**self.env, **env}, stdout=log,
                                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                start_new_session=True, cwd=self.root,
                                                preexec_fn=None if self.detached else die_with_parent)

    @contextlib.contextmanager
    def restarting(self, every_s: float = 1.0) -> Iterator[list[str]]:
        """Components that exit meanwhile are started again, as Kubernetes restarts a container;
        yields the names restarted, in order. The watcher thread that relaunches them lives until
        ``stop()``: a child's parent-death signal (``die_with_parent``) follows the *thread* that
        started it, so a watcher ending with the block would take its relaunches down with it."""
        restarted: list[str] = []
        self._restart_into = restarted
        if self._watcher is None:
            self._watcher = threading.Thread(target=self._watch, args=(every_s,), daemon=True)
            self._watcher.start()
        try:
            yield restarted
        finally:
            with self._launching:
                self._restart_into = None

    def _watch(self, every_s: float) -> None:
        while not self._stopping.wait(every_s):
            with self._launching:
                if self._restart_into is None:
                    continue
                for name, proc in list(self.procs.items()):
                    if proc.poll() is not None:
                        self._restart_into.append(name)
                        self.launch(name)

    def kill(self, name: str) -> None:
        """SIGKILL component ``name`` and every process of its group (a machine lost, not a shutdown)."""
        proc = self.procs.pop(name)
        signal_group(proc.pid, signal.SIGKILL)
        proc.wait()

    def log_path(self, component: str) -> Path:
        return self.root / f"{component}.log"

    def _healthy(self) -> bool:
        return answers(f"{self.url}/api/v2/monitor/health",
                       {f"airflow {name}": (proc, self.log_path(name)) for name, proc in self.procs.items()})

    def token(self, user: str = "admin") -> str:
        resp = httpx.post(f"{self.url}/auth/token", json={"username": user, "password": self.password}, timeout=30)
        resp.raise_for_status()
        return resp.json()["access_token"]

    def client(self, user: str) -> httpx.Client:
        """A REST client acting as ``user`` (one of ``USERS``)."""
        return httpx.Client(base_url=self.url, timeout=30, headers={"Authorization": f"Bearer {self.token(user)}"})

    # REST helpers ------------------------------------------------------------------------------
    def wait_dag(self, dag_id: str, timeout_s: float = 120) -> dict[str, Any]:
        def probe():
            resp = self.api.get(f"/api/v2/dags/{dag_id}")
            return resp.json() if resp.status_code == 200 else None

        return wait_for(f"DAG {dag_id} to be parsed", probe, timeout_s, every_s=1)

    def unpause(self, dag_id: str) -> None:
        self.api.patch(f"/api/v2/dags/{dag_id}", json={"is_paused": False}).raise_for_status()

    def files_holding(self, text: str) -> list[str]:
        """Every file under this deployment's folders (Airflow's and Taxiway's homes, config root) that
        holds ``text``."""
        needle = text.encode()
        return [str(p) for p in self.root.rglob("*") if p.is_file() and not p.is_symlink()
                and needle in p.read_bytes()]

    def trigger(self, dag_id: str, conf: dict[str, Any]) -> httpx.Response:
        return self.api.post(f"/api/v2/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": conf})

    def dag_run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        resp = self.api.get(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")
        resp.raise_for_status()
        return resp.json()

    def task_instances(self, dag_id: str, run_id: str) -> dict[str, dict[str, Any]]:
        resp = self.api.get(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances", params={"limit": 100})
        resp.raise_for_status()
        return {ti["task_id"]: ti for ti in resp.json()["task_instances"]}

    def task_instance(self, dag_id: str, run_id: str, task_id: str) -> dict[str, Any]:
        resp = self.api.get(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}")
        resp.raise_for_status()
        return resp.json()

    def wait_run(self, dag_id: str, run_id: str, timeout_s: float = 240) -> dict[str, Any]:
        def probe():
            run = self.dag_run(dag_id, run_id)
            return run if run["state"] in TERMINAL else None

        def explain() -> str:  # where a run that did not finish in time was stuck
            return str({k: (ti["state"], ti["try_number"]) for k, ti in self.task_instances(dag_id, run_id).items()})

        return wait_for(f"run {run_id} to finish", probe, timeout_s, every_s=2, explain=explain)

    def process_exit_seen(self, dag_id: str, run_id: str, task_id: str, state: str) -> bool:
        """Whether the scheduler has taken in the executor's report that the process which left ``task_id``
        in ``state`` (``deferred``, ``awaiting_input``) has ended: its "TaskInstance Finished" log line.
        Airflow 3.3.2 fails a task resumed before then as "killed externally" (docs/evaluation.md)."""
        line = f"TaskInstance Finished: dag_id={dag_id}, task_id={task_id}, run_id={run_id}, "
        with self.log_path("scheduler").open(errors="replace") as log:
            return any(line in entry and f", state={state}, " in entry for entry in log)

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> str | None:
        """A try's log file as the worker wrote it (JSON lines), or None before it exists."""
        paths = list((self.home / "logs").glob(f"dag_id={dag_id}/run_id={run_id}/task_id={task_id}/"
                                               f"attempt={try_number}.log"))
        return paths[0].read_text(errors="replace") if paths else None


class _RetryingClient(httpx.Client):
    """The api-server answers any request 500 "Database error" while the metadata database does not
    answer (a fault test stops it); such an answer changed nothing and is retried (any other answer,
    a 4xx included, is the request's own), as is a refused connection while an api-server restarts.
    Any 5xx it returns is printed with the api-server's last traceback (a plain "Internal Server Error"
    says nothing more), so a failing test's captured output shows why."""

    def __init__(self, server_log: Path, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.server_log = server_log

    def request(self, *args: Any, **kwargs: Any) -> httpx.Response:
        resp = self._request(*args, **kwargs)
        if resp.status_code >= 500:
            print(f"{resp.request.method} {resp.request.url.path} answered {resp.status_code}; {self.last_traceback()}")
        return resp

    def last_traceback(self) -> str:
        """The api-server's log from its last logged exception on, or a line saying there is none."""
        log = self.server_log.read_text(errors="replace")
        start = max(log.rfind("Exception in ASGI application"), log.rfind("Error with id"))
        start = start if start >= 0 else log.rfind("Traceback (")
        return f"the api-server's log from its last exception:\n{log[start:][:8000]}" if start >= 0 else \
            "the api-server logged no exception"

    def _request(self, *args: Any, **kwargs: Any) -> httpx.Response:
        for attempt in range(30):  # an api-server restarting (a fault test) answers again within ~30 s
            try:
                resp = super().request(*args, **kwargs)
            except httpx.ConnectError:  # nothing was sent: safe to send again
                if attempt == 29:
                    raise
                time.sleep(1)
                continue
            if resp.status_code != 500 or "Database error" not in resp.text or attempt >= 4:
                return resp
            time.sleep(1)
        raise AssertionError("unreachable")


def stop_gangs(taxiway_home: Path) -> None:
    """Stop any training gang of this home that a failed test left behind."""
    from pipelines.launch import local

    for gang_json in taxiway_home.glob("runs/*/*/train/gang.json"):
        local.cleanup(local.Handle.load(gang_json), grace_s=5)


def stop_state(state: dict[str, Any], grace_s: float = 20) -> None:
    """Stop a detached deployment from its ``state()``: SIGTERM each component's process group,
    SIGKILL what is left after ``grace_s``, then its gangs."""
    for pid in state["pids"].values():
        signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_alive(pid) for pid in state["pids"].values()):
        time.sleep(0.2)
    for pid in state["pids"].values():
        signal_group(pid, signal.SIGKILL)
    stop_gangs(Path(state["root"]) / "taxiway")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def shared_local(tiny: Path) -> LiveAirflow:
    """The session's one LocalExecutor deployment (metadata on the session's PostgreSQL), with the tiny
    config's corpus, its landing zone and MLflow's artifacts in a bucket of the tests' S3 server
    (``bucket``), and ``taxiway_train`` unpaused: started by the first process that asks, under the
    session's lock, and reached from every other (deploy/local/services.py stops it when the session ends).
    Tests share it as users share one: each works in DAG runs and config files of its own."""
    import services
    from postgres import create_db, pg_uri

    def start(folder: Path) -> dict[str, Any]:
        import s3_server

        from pipelines.demo_data import write_demo_data

        name = f"taxiway_live_{secrets.token_hex(6)}"
        create_db(name)
        config = folder / "configs" / "deployment.yaml"
        config.parent.mkdir(parents=True, exist_ok=True)
        bucket = s3_server.bucket("live")  # the deployment's object storage: the landing zone and MLflow's artifacts
        config.write_text(f"extends: {tiny}\nlimits:\n  trigger_may_set: [{', '.join(SHARED_MAY_SET)}]\n"
                          f"refresh:\n  landing: s3://{bucket}/landing\n")
        home = folder / "taxiway"
        data_roots = [str(home / name) for name in ("data", "demo-data")] + [f"s3://{bucket}"]
        live = LiveAirflow(folder, metadata_uri=pg_uri(name), detached=True, extra_env={
            "TAXIWAY_CONFIG": str(config), **s3_server.env(), "TAXIWAY_DATA_ROOTS": ":".join(data_roots),
            "TAXIWAY_MLFLOW_ARTIFACTS": f"s3://{bucket}/mlartifacts"})
        write_demo_data(live.taxiway_home / "demo-data", seed=0, max_files=160)
        try:
            live.start()
            live.wait_dag("taxiway_train")
            live.unpause("taxiway_train")
        except BaseException:
            stop_state(live.state())
            raise
        state = live.state()
        return {**state, "stop": [sys.executable, str(Path(__file__).resolve()), json.dumps(state)]}

    return LiveAirflow.from_state(services.shared("live-airflow", start))


def settings(body: str) -> dict[str, Any]:
    """Owned settings of the shared deployment's that a test varies (``SHARED_MAY_SET``), as a conf."""
    return yaml.safe_load(body)


def die_with_parent() -> None:
    """A test process killed outright (timeout, ^C) must not leave an Airflow running: PR_SET_PDEATHSIG."""
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


def signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


if __name__ == "__main__":  # the shared deployment's stop command (``shared_local``), run when the session ends
    stop_state(json.loads(sys.argv[1]))
