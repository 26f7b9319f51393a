"""The production shape, run here: Airflow on PostgreSQL with the CeleryExecutor (Redis broker, two
Celery workers), a separate scheduler, dag-processor, triggerer and api-server, and an MLflow tracking
server (its own PostgreSQL database, proxied artifacts) that every task reaches through
``MLFLOW_TRACKING_URI``. As docs/deploy.md's "Taxiway's own Airflow settings" says a team places its
work: the tasks that need the training worker on the deployment's ``gpu_queue`` (here ``gpu``, which
both workers listen on beside ``default``), registrations behind its ``registry_pool`` (one slot). Each database is the test's own, dropped afterwards, on the session's own
PostgreSQL (deploy/local/postgres.py); the broker is the session's own Redis (deploy/local/redis_server.py)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time

import psutil
import pytest
from live_airflow import CeleryShape, LiveAirflow, wait_for
from live_training import new_gang, stepping, task_process
from mlflow_server import mlflow_server
from postgres import fresh_db, pg_uri
from redis_server import redis_url
from trainer_corpus import gang_pids

from conftest import TINY, taxiway
from pipelines.run_folder import run_dir as run_folder_of

pytestmark = pytest.mark.live
DAG = "taxiway_train"
MODEL = "taxiway-tiny-gpt"
STEPS = 100  # the gang trains on while its task is lost; the retry finds it running or done
GPU_QUEUE, REGISTRY_POOL = "gpu", "taxiway_registry"
GPU_TASKS = ("train.smoke", "train.gang", "evaluate.score")


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    """The shape above, started once for the module; ``deployment.mlflow_uri`` is the tracking server."""
    from pipelines.demo_data import write_demo_data

    root = tmp_path_factory.mktemp("celery")
    with fresh_db("taxiway_airflow") as metadata, mlflow_server(root / "mlflow") as tracking:
        live = LiveAirflow(root / "airflow-deployment",
                           extra_env={"TAXIWAY_CONFIG": str(TINY), "MLFLOW_TRACKING_URI": tracking.uri,
                                      "AIRFLOW__TAXIWAY__GPU_QUEUE": GPU_QUEUE,
                                      "AIRFLOW__TAXIWAY__REGISTRY_POOL": REGISTRY_POOL},
                           celery=CeleryShape(pg_uri(metadata), redis_url(), queues=("default", GPU_QUEUE)))
        write_demo_data(live.taxiway_home / "demo-data", seed=0, max_files=160)
        live.mlflow_uri, live.tracking, live.databases = tracking.uri, tracking, (metadata, tracking.db)
        with live.serving(DAG):
            made = live.api.post("/api/v2/pools", json={"name": REGISTRY_POOL, "slots": 1,
                                                        "description": "Taxiway registrations"})
            assert made.status_code == 201, made.text
            yield live


def _trigger(live: LiveAirflow, conf: dict) -> str:
    """A run triggered with the official client (``apache-airflow-client``), as a user's script would."""
    import airflow_client.client as af

    api = af.ApiClient(af.Configuration(host=live.url, access_token=live.token()))
    run = af.DagRunApi(api).trigger_dag_run(DAG, af.TriggerDAGRunPostBody(logical_date=None, conf=conf))
    return run.dag_run_id


def _worker_logs(live: LiveAirflow) -> dict[str, str]:
    return {name: live.log_path(name).read_text(errors="replace") for name, _, _ in live.components
            if name.startswith("celery-worker")}


def test_each_celery_worker_preloads_the_heavy_task_imports(deployment):
    """deploy/airflow-values.yaml's ``celery_config_options``: imported once per worker, before it
    forks task processes (the preflight gate's 3 s of Great Expectations import, paid at start-up),
    and the supervisor's exit wait installed in the process its task supervisors are forked from."""
    for name in ("celery-worker-1", "celery-worker-2"):
        line = wait_for(f"{name} to preload", lambda name=name: next(
            (ln for ln in deployment.log_path(name).read_text().splitlines() if "preloaded Great Expectations" in ln),
            None), timeout_s=120)
        assert "supervisor exit wait installed" in line, line


def test_a_celery_worker_killed_while_it_holds_the_training_task_is_survived(deployment):
    """The training task's worker is SIGKILLed (with its task process) while it holds the task, after
    it launched the gang: the scheduler notices the missing heartbeats, the retry runs on the other
    worker, takes over the gang or restarts it from the newest checkpoint, and the run succeeds with
    no process of any gang left."""
    live = deployment
    run_id = _trigger(live, {"train": {"steps": STEPS}, "checkpoint": {"every_steps": 10}})
    run_dir = run_folder_of(DAG, run_id, live.taxiway_home)

    def explain() -> str:
        return json.dumps(live.task_instances(DAG, run_id).get("train.gang", {}), default=str)[:2000]

    handle = new_gang(run_dir, None, explain, timeout_s=180)
    ti = live.task_instance(DAG, run_id, "train.gang")
    holder = task_process(ti["id"])
    os.kill(holder, signal.SIGSTOP)  # the worker holds the task: it cannot defer now
    stepping(run_dir, handle, 2)
    ancestors = {p.pid for p in psutil.Process(holder).parents()}
    worker = next(name for name, proc in live.procs.items() if name.startswith("celery-worker") and proc.pid in ancestors)
    # the worker's machine is lost: every process it started dies at once, except the gang's nodes,
    # which stand for pods on other machines
    nodes = set(gang_pids(handle.gang_id))
    doomed = [p for p in psutil.Process(live.procs[worker].pid).children(recursive=True) if p.pid not in nodes]
    live.kill(worker)
    for proc in doomed:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    assert set(gang_pids(handle.gang_id)) == nodes  # the gang trains on, its task's holder gone
    killed_at = time.monotonic()
    try:
        run = live.wait_run(DAG, run_id, timeout_s=240)
    finally:
        live.launch(worker)
    tis = live.task_instances(DAG, run_id)
    assert run["state"] == "success", {k: (t["state"], t["try_number"]) for k, t in tis.items()}
    assert tis["train.gang"]["try_number"] >= 2, tis["train.gang"]
    # placement: the training worker's tasks went through the gpu queue, registration through its pool
    assert {t: tis[t]["queue"] for t in GPU_TASKS} == dict.fromkeys(GPU_TASKS, GPU_QUEUE)
    assert {ti["queue"] for t, ti in tis.items() if t not in GPU_TASKS} == {"default"}
    assert tis["register.model_version"]["pool"] == REGISTRY_POOL and tis["tokenize.pack"]["pool"] == "default_pool"
    model = json.loads((run_dir / "model" / "model.json").read_text())
    assert model["global_step"] == STEPS
    # the retry found the gang through the task's stored job id and took it over (still running, or
    # done meanwhile), or found it dead and launched the next one from the newest valid checkpoint
    retry = live.task_log(DAG, run_id, "train.gang", tis["train.gang"]["try_number"]) or ""
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    outcome = next((o for o in ("Reconnecting to existing job", "Job already completed successfully",
                                "Prior job in terminal state") if o in retry), None)
    assert outcome, retry[-3000:]
    if outcome.startswith("Prior"):
        assert [e for e in events if e["event"] == "resumed" and e["global_step"] > 0], events[-20:]
    gangs = {json.loads((run_dir / "train" / "gang.json").read_text())["gang_id"], handle.gang_id}
    wait_for("no process of any gang of the run", lambda: not any(gang_pids(g) for g in gangs), 30)
    assert not [p.pid for p in doomed if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    print(f"worker {worker} killed; the run succeeded {time.monotonic() - killed_at:.0f}s later, train.gang try "
          f"{tis['train.gang']['try_number']}: {outcome}")


def _felt(log: bytes) -> bool:
    """A component's log says PostgreSQL refused or dropped it (psycopg2's own messages)."""
    return b"not currently accepting connections" in log or b"terminating connection due to administrator" in log


def _outage(databases: tuple[str, ...], seconds: float) -> None:
    """PostgreSQL gone for ``seconds``, for these databases only: new connections refused, every
    existing one terminated, again and again; then connections allowed back."""
    from postgres import admin

    conn = admin()
    cur = conn.cursor()
    try:
        for db in databases:
            cur.execute(f"ALTER DATABASE {db} ALLOW_CONNECTIONS false")
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = ANY(%s) "
                        "AND pid <> pg_backend_pid()", (list(databases),))
            time.sleep(0.5)
    finally:
        for db in databases:
            cur.execute(f"ALTER DATABASE {db} ALLOW_CONNECTIONS true")
        conn.close()


def test_a_run_on_celery_workers_survives_the_database_going_away(deployment, monkeypatch):
    """One ``taxiway_train`` run, triggered with the official client: its tasks run on the Celery
    workers, its training wait in the triggerer, its metrics and model go through the MLflow tracking
    server. PostgreSQL refuses the deployment's databases for 10 s while the gang trains: the
    components feel it, those that exit on it are restarted (as Kubernetes would), and the run
    succeeds with exactly one version, its alias decided, its live metrics and generation through the
    tracking server. (A tracking server away while a run registers: tests/test_live_conf.py's
    transient failure, and the store coming back in tests/test_registry.py.)"""
    live = deployment
    monkeypatch.setenv("MLFLOW_TRACKING_URI", live.mlflow_uri)
    from pipelines.registry import client

    run_id = _trigger(live, {"train": {"steps": 200}})
    wait_for("the gang to train", lambda: live.task_instance(DAG, run_id, "train.gang")["state"] == "deferred", 240)
    logs_before = {name: live.log_path(name).stat().st_size for name, _, _ in live.components}
    with live.restarting() as restarted:
        _outage(live.databases, 10)
        run = live.wait_run(DAG, run_id, timeout_s=240)
    tis = live.task_instances(DAG, run_id)
    assert run["state"] == "success", {k: (t["state"], t["try_number"]) for k, t in tis.items()}
    felt = {name for name, _, _ in live.components if _felt(live.log_path(name).read_bytes()[logs_before[name]:])}
    assert "scheduler" in felt | set(restarted), (felt, restarted)  # the scheduler queries the database every loop
    print(f"PostgreSQL away 10 s: felt by {sorted(felt)}; restarted: {restarted}")

    # every task that ran was executed by a Celery worker (each names the task it executes)
    ran = {k for k, ti in tis.items() if ti["state"] == "success"}
    logs = _worker_logs(live)
    executed = {task for task in ran if any(f"'task_id': '{task}'" in log or f"task_id='{task}'" in log
                                            for log in logs.values())}
    assert executed == ran, (sorted(ran - executed), {k: v[-1500:] for k, v in logs.items()})
    # the training wait ran in the triggerer: its trigger logs are written by TriggererJobs (the file
    # names the job; a triggerer restarted by the outage picks the trigger up under its own id)
    jobs = {j["id"] for j in live.api.get("/api/v2/jobs", params={"job_type": "TriggererJob", "limit": 100}).json()["jobs"]}
    trigger_logs = list((live.home / "logs").glob(f"dag_id={DAG}/run_id={run_id}/task_id=train.gang/attempt=*.log.trigger.*.log"))
    assert trigger_logs and {int(p.name.split(".")[-2]) for p in trigger_logs} <= jobs, (trigger_logs, jobs)
    records = [json.loads(line) for p in trigger_logs for line in p.read_text().splitlines()]
    assert any(r["event"] == "Trigger fired event" for r in records)
    assert any(r.get("logger", "").endswith("GangTrigger") and "succeeded step 200/200" in r["event"] for r in records)

    # one version, alias decided; metrics and generation through the tracking server
    c = client()
    ours = [v for v in c.search_model_versions(f"name = '{MODEL}'") if v.tags.get("airflow.run_id") == run_id]
    aliases = c.get_model_version(MODEL, ours[0].version).aliases if len(ours) == 1 else None  # search omits them
    assert aliases and set(aliases) <= {"champion", "challenger"}, (ours, aliases)
    assert len(c.get_metric_history(ours[0].run_id, "loss")) >= 10
    out = taxiway("generate", f"models:/{MODEL}/{ours[0].version}", "--prompt", "def ", "--max-new-tokens", "8",
                  check=True, env={"MLFLOW_TRACKING_URI": live.mlflow_uri, "TAXIWAY_HOME": str(live.taxiway_home)})
    assert out.stdout.startswith("def "), out.stdout
    # the components restarted during the outage outlive it (the module's next test needs them); the
    # checks above took seconds, far longer than a component takes to stop on a signal
    assert not {name: proc.returncode for name, proc in live.procs.items() if proc.poll() is not None}
