"""``taxiway_train`` on the Kubernetes launcher, executed: a live api-server + scheduler + dag-processor
+ triggerer (LocalExecutor, metadata on PostgreSQL) parsed with ``TAXIWAY_LAUNCHER=kubernetes``, talking
to ``FakeKube`` (tests/fake_kube.py), whose pods really run: each node pod's ``torchrun`` in a network
namespace of its own, meeting at the c10d rendezvous by the Service's DNS name
``<job>-0.<service>``, checkpoints on the shared volume (the PVC bound to this deployment's
TAXIWAY_HOME), evaluate and register after it. What only a real cluster can show (scheduling, real
DNS, GPUs, NCCL): docs/deploy.md.

- a pod killed mid-training fails the Job (``backoffLimit: 0``); the task's retry starts the next
  gang, which resumes from the newest valid checkpoint; the run registers the same model, loss curve
  for loss curve, as the local launcher on the same config and seed;
- MLflow is a server that needs a login, given to the workers and the triggerer as the connection
  ``mlflow_default`` (as deploy/airflow-values.yaml does): the loss curve is there while the gang trains;
- a pod cut off from the others (its veth down) hangs every rank: the trigger sees the stall on
  ``status.json``, deletes the Job, and the retry restarts the gang; the worker holding that retry
  is lost before it defers: the next try re-attaches to the running Job (no third Job); the user
  marks the task failed: the Job is deleted with its pods, a valid checkpoint is left, and the
  teardown leaves no object in the cluster.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any

import netns_pods
import psutil
import pytest
from fake_kube import FakeKube
from live_airflow import LiveAirflow, wait_for
from live_training import task_process
from mlflow_server import mlflow_server
from postgres import fresh_db, pg_uri

from conftest import taxiway
from pipelines.launch import k8s
from pipelines.run_folder import RunFolder
from pipelines.run_folder import run_dir as run_folder_of
from trainer import checkpoint
from trainer.status import State

pytestmark = [pytest.mark.live,
              pytest.mark.skipif(netns_pods.available() is not None, reason=str(netns_pods.available()))]
DAG = "taxiway_train"
GANG = "train.gang"
TRAINING = (State.RUNNING, State.CHECKPOINTING)  # a trainer between its steps and its checkpoints
IMAGE = "registry.example.com/taxiway-trainer@sha256:" + "0123456789abcdef" * 4
STALL_S = 10


def _config(mount: Path) -> str:
    """The deployment's config: 2 node pods x 1 process on the stand-in cluster, its PVC at TAXIWAY_HOME."""
    return f"""compute:
  launcher: kubernetes
  nodes: 2
  procs_per_node: 1
  stall_timeout_s: {STALL_S}
  cancel_grace_s: 10
  report_every_s: 5
  kubernetes:
    connection_id: taxiway_kube
    namespace: taxiway
    image: {IMAGE}
    volume_claim: taxiway-home
    mount_path: {mount}
    cpu: "1"
    memory: 2Gi
    shm_size: 256Mi
    checkpoint_save_s: 5
    termination_grace_s: 20
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The deployment and its stand-in cluster, for the module. Rank 1 sleeps 0.1 s before each batch
    (the image's ENV), so each gang trains long enough to be acted on, however fast the machine."""
    from pipelines.demo_data import write_demo_data

    root = tmp_path_factory.mktemp("k8s")
    folder = root / "deployment"
    kube = FakeKube(root / "kube", volumes={"taxiway-home": folder / "taxiway"},
                    image_env={"TAXIWAY_TEST_SLOW_RANK": "1:0.1"})
    config = folder / "configs" / "kube.yaml"
    with fresh_db("taxiway_k8s") as metadata, mlflow_server(root / "mlflow", auth=True) as tracking:
        user, password = tracking.login
        live = LiveAirflow(folder, metadata_uri=pg_uri(metadata), extra_env={
            "TAXIWAY_LAUNCHER": "kubernetes", "TAXIWAY_CONFIG": str(config),
            # MLflow as deployed: a server that needs a login, given as the connection mlflow_default
            # (deploy/airflow-values.yaml) to the workers and to the triggerer, which ships the curves
            "MLFLOW_TRACKING_URI": tracking.uri, "TAXIWAY_MLFLOW_LOGIN_CONN_ID": "mlflow_default",
            "AIRFLOW_CONN_MLFLOW_DEFAULT": json.dumps({"conn_type": "mlflow", "host": tracking.uri, "login": user,
                                                       "password": password}),
            "AIRFLOW_CONN_TAXIWAY_KUBE": json.dumps({"conn_type": "kubernetes", "extra": {
                "kube_config_path": str(kube.kubeconfig(root / "kubeconfig"))}}),
            # a lost worker is noticed by its task's missing heartbeats: soon, not after 5 min
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "15",
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "3"})
        config.parent.mkdir(parents=True)
        config.write_text(f"extends: {Path(__file__).parents[1] / 'configs' / 'tiny.yaml'}\n{_config(live.taxiway_home)}")
        write_demo_data(live.taxiway_home / "demo-data", seed=0, max_files=160)
        live.kube, live.config, live.tracking = kube, config, tracking
        try:
            with live.serving(DAG):
                yield live
        finally:
            kube.close()


def _trigger(live: LiveAirflow, conf: dict[str, Any]) -> tuple[str, Path]:
    response = live.trigger(DAG, conf)
    assert response.status_code == 200, response.text
    run_id = response.json()["dag_run_id"]
    return run_id, run_folder_of(DAG, run_id, live.taxiway_home)


def _status(run_dir: Path) -> dict[str, Any]:
    return RunFolder(run_dir).read_status()


def _training(live: LiveAirflow, run_id: str, run_dir: Path, job: str, min_step: int, timeout_s: float = 240) -> list:
    """Wait until every pod of ``job`` runs and the run's status says step ``min_step`` or later."""
    kube: FakeKube = live.kube

    def probe():
        pods = kube.pods_of(job)
        s = _status(run_dir)
        return (len(pods) == 2 and all(p["status"]["phase"] == "Running" for p in pods)
                and s.get("state") == "running" and (s.get("step") or 0) >= min_step and pods)

    def explain() -> str:
        tis = {k: (t["state"], t["try_number"]) for k, t in live.task_instances(DAG, run_id).items()}
        return f"tasks {tis}; cluster {kube.created}; status {_status(run_dir)}"

    return wait_for(f"Job {job} training at step {min_step}", probe, timeout_s, every_s=0.2, explain=explain)


def _created(kube: FakeKube, service: str) -> list[str]:
    """What this run created in the cluster (the module's runs share it), in order."""
    return [c for c in kube.created if service.removeprefix("tw-") in c]


def _pods_table(pods: list[dict[str, Any]]) -> str:
    rows = []
    for pod in pods:
        state = pod["status"].get("containerStatuses", [{}])[0].get("state", {})
        code = state.get("terminated", {}).get("exitCode", "-")
        rows.append(f"{pod['metadata']['name']}  hostname={pod['spec']['hostname']}.{pod['spec']['subdomain']}  "
                    f"ip={pod['status'].get('podIP')}  phase={pod['status']['phase']}  exit={code}")
    return "\n".join(rows)


def _processes_of(run_dir: Path) -> list[str]:
    """Processes still running anything of the run (a pod's trainers outliving their pod)."""
    return [cmd for p in psutil.process_iter(["cmdline"]) if str(run_dir) in (cmd := " ".join(p.info["cmdline"] or []))]


def _losses(run_dir: Path) -> dict[int, float]:
    """The loss of each logged step, the last attempt's where a restart logged a step twice."""
    records = [json.loads(line) for line in RunFolder(run_dir).metrics.read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if r.get("loss") is not None}


def test_a_dag_run_on_pods_that_really_run_survives_a_killed_pod_and_matches_the_local_launcher(cluster, tmp_path):
    live, kube = cluster, cluster.kube
    run_id, run_dir = _trigger(live, {"train": {"steps": 60}, "checkpoint": {"every_steps": 10}})
    job_1, service = k8s.names(run_id, 1)
    job_2 = k8s.names(run_id, 2)[0]
    pods = _training(live, run_id, run_dir, job_1, 22)
    assert len({p["status"]["podIP"] for p in pods}) == 2
    kube.kill_container(pods[1]["metadata"]["name"])  # the node's OOM killer, or its power
    run = live.wait_run(DAG, run_id, timeout_s=300)
    tis = live.task_instances(DAG, run_id)
    assert run["state"] == "success", {k: (t["state"], t["try_number"]) for k, t in tis.items()}
    assert tis[GANG]["try_number"] == 2
    assert _created(kube, service) == [f"Service/{service}", f"Job/{job_1}", f"Job/{job_2}"]
    wait_for("the teardown to leave nothing", lambda: not (kube.of("Job") or kube.of("Pod") or kube.of("Service")), 60)
    assert not _processes_of(run_dir)

    first = [p for p in kube.gone if p["metadata"]["labels"]["batch.kubernetes.io/job-name"] == job_1]
    second = [p for p in kube.gone if p["metadata"]["labels"]["batch.kubernetes.io/job-name"] == job_2]
    exit_code = {int(p["metadata"]["labels"][k8s.INDEX_KEY]): p["status"]["containerStatuses"][0]["state"]
                 ["terminated"]["exitCode"] for p in first}
    assert exit_code[1] == 137 and exit_code[0] != 0, exit_code  # killed; the controller stopped the other
    assert [p["status"]["phase"] for p in second] == ["Succeeded", "Succeeded"]
    rank1 = kube.log(next(p for p in second if p["metadata"]["labels"][k8s.INDEX_KEY] == "1")["metadata"]["name"])
    rendezvous = re.search(r'.*"event": "rendezvous_reached".*', rank1)  # rank 1 met rank 0 by its DNS name
    assert rendezvous and f'"master": "{job_2}-0.{service}:' in rendezvous.group(0), rank1[-3000:]
    events = [json.loads(x) for x in RunFolder(run_dir).events.read_text().splitlines()]
    resumed = [e for e in events if e["event"] == "resumed"]
    assert resumed and resumed[-1]["global_step"] >= 20, events[-10:]
    print(f"\npods of the killed try:\n{_pods_table(first)}\npods of the retry:\n{_pods_table(second)}\n"
          f"rank 1's rendezvous: {rendezvous.group(0).strip()}")

    # the same config and seed on the local launcher (2 local torchrun nodes): the same model
    local_home = tmp_path / "local"
    from pipelines.demo_data import write_demo_data
    write_demo_data(local_home / "demo-data", seed=0, max_files=160)
    local_run = local_home / "runs" / "local"
    taxiway("run", "--config", str(live.config), "--set", "compute.launcher=local", "--set", "train.steps=60",
            "--set", "checkpoint.every_steps=10", "--run-dir", str(local_run), check=True,
            env={"TAXIWAY_HOME": str(local_home), "TAXIWAY_CONFIG_ROOTS": str(live.config.parent)})
    on_pods, on_local = _losses(run_dir), _losses(local_run)
    assert on_pods.keys() == on_local.keys() and len(on_pods) >= 10
    assert all(abs(on_pods[s] - on_local[s]) <= 1e-5 * max(1.0, abs(on_local[s])) for s in on_local), (on_pods, on_local)
    scores = [{k: v for k, v in json.loads(RunFolder(r).eval_report.read_text())["candidate"].items() if k != "model"}
              for r in (run_dir, local_run)]  # everything but where the model lies
    assert _close(*scores), scores


def _live_curve(live: LiveAirflow, run_id: str, min_points: int, monkeypatch) -> list:
    """The run's loss curve in the deployment's MLflow (logged in as its admin) once it has ``min_points``."""
    from mlflow import MlflowClient

    from pipelines.registry.runs import RUN_KEY_TAG
    from pipelines.run_folder import run_key

    user, password = live.tracking.login
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", user)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", password)
    c = MlflowClient(live.tracking.uri)

    def curve() -> list | None:
        runs = c.search_runs([e.experiment_id for e in c.search_experiments()],
                             f"tags.`{RUN_KEY_TAG}` = '{run_key(DAG, run_id)}'")
        points = c.get_metric_history(runs[0].info.run_id, "loss") if runs else []
        return points if len(points) >= min_points else None

    return wait_for(f"{min_points} points of the loss curve in MLflow", curve, 60, every_s=1,
                    explain=lambda: (live.task_log(DAG, run_id, GANG, 1) or "")[-2000:])


def _close(a: Any, b: Any) -> bool:
    """Equal structures whose numbers agree to float tolerance."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= 1e-5 * max(1.0, abs(b))
    return a == b


def test_a_cut_pod_is_a_stall_a_lost_worker_reattaches_and_a_cancel_deletes_the_job(cluster, monkeypatch):
    live, kube = cluster, cluster.kube
    run_id, run_dir = _trigger(live, {"train": {"steps": 100000}, "checkpoint": {"every_steps": 5}})
    job_1, service = k8s.names(run_id, 1)
    job_2, job_3 = k8s.names(run_id, 2)[0], k8s.names(run_id, 3)[0]

    # 1. pod 1's node loses its network: every rank hangs in its collective, nothing exits
    pods = _training(live, run_id, run_dir, job_1, 7)
    # 0. the loss curve reaches MLflow while the gang trains: the triggerer ships it, logged in
    curve = _live_curve(live, run_id, min_points=5, monkeypatch=monkeypatch)
    gang = live.task_instance(DAG, run_id, GANG)  # still training, still the first try's trigger: it shipped them
    # a checkpoint every 5 steps: the trainer is as likely to be checkpointing as running when looked at
    assert _status(run_dir)["state"] in TRAINING and (gang["state"], gang["try_number"]) == ("deferred", 1), gang
    # the shipped points are the run's own logged steps (status.json's step is throttled, metrics.jsonl is not)
    assert {m.step for m in curve} <= _losses(run_dir).keys(), curve
    cut_at = time.monotonic()
    kube.cut(pods[1]["metadata"]["name"])

    # 2. the retry creates the next Job; its worker is lost before it defers (frozen at its first look
    #    at the Job's pods, after the Job's name is in the task's state store, then killed outright)
    frozen: list[int] = []
    created_2 = threading.Event()

    def freeze_the_worker(method: str, path: str) -> None:
        if method == "POST" and path.endswith("/jobs"):
            created_2.set()
        elif created_2.is_set() and not frozen and method == "GET" and "/pods?" in path:
            ti = live.task_instance(DAG, run_id, GANG)
            holder = task_process(ti["id"])
            os.kill(holder, signal.SIGSTOP)
            frozen.append(holder)

    kube.on_request = freeze_the_worker
    try:
        wait_for("the retry to create its Job and be frozen", lambda: frozen, 180, every_s=0.2)
    finally:
        kube.on_request = None
    stall_seen = time.monotonic() - cut_at
    trigger_log = live.task_log(DAG, run_id, GANG, 1) or ""
    assert re.search(r"stalled: no heartbeat and no step progress for \d+ s \(compute.stall_timeout_s=10\)",
                     trigger_log), trigger_log[-3000:]
    holder = psutil.Process(frozen[0])
    for proc in (holder, holder.parent()):  # the task process and its supervisor: the worker's machine
        proc.kill()
    assert [j for j in kube.of("Job") if service.removeprefix("tw-") in j] == [job_2]

    # 3. the scheduler notices the missing heartbeats; the next try finds the Job running and re-attaches
    pods = _training(live, run_id, run_dir, job_2, 12, timeout_s=240)
    wait_for("the gang task to be deferred again", lambda: (t := live.task_instance(DAG, run_id, GANG))["state"]
             == "deferred" and t["try_number"] == 3, 120, every_s=0.5)
    retry_log = live.task_log(DAG, run_id, GANG, 3) or ""
    assert "Reconnecting to existing job" in retry_log, retry_log[-3000:]
    assert f"Job/{job_3}" not in _created(kube, service)

    # 4. the user marks the task failed: the trigger's on_kill deletes the Job in the foreground
    step = _status(run_dir)["step"]
    response = live.api.patch(f"/api/v2/dags/{DAG}/dagRuns/{run_id}/taskInstances/{GANG}", json={"new_state": "failed"})
    assert response.status_code == 200, response.text
    run = live.wait_run(DAG, run_id, timeout_s=180)
    assert run["state"] == "failed"
    tis = live.task_instances(DAG, run_id)
    assert tis["train.teardown"]["state"] == "success", tis["train.teardown"]
    assert not (kube.of("Job") or kube.of("Pod") or kube.of("Service")), kube.created
    assert not _processes_of(run_dir)  # the stalled Job's hung trainers went with their pods' PID namespaces
    assert _created(kube, service) == [f"Service/{service}", f"Job/{job_1}", f"Job/{job_2}"]
    newest = checkpoint.latest_valid(RunFolder(run_dir).checkpoints)
    saved = int(newest.name.removeprefix("step-")) if newest else -1
    assert saved >= step, (newest, step)  # the SIGTERMed trainer saved where it stood
    print(f"\nstall seen and the next Job created {stall_seen:.0f}s after the cut; worker lost, try 3 re-attached "
          f"to {job_2}; canceled at step {step}, newest valid checkpoint {newest.name}")
