"""Kubernetes launch: the rendered objects, validated without a cluster.

Every object is checked against the official Kubernetes OpenAPI schemas (``kubernetes-validate``,
strict: unknown fields fail) for the oldest supported (1.28: the Job's pod-index label) and the
newest bundled version, and again after going through the provider's own path
(``KubernetesJobOperator.build_job_request_obj`` / ``dry_run``), which is what the DAG submits.
The cluster itself is the one boundary that cannot exist here. Rendering tests contact no API
server; the operator tests below talk real HTTP to ``FakeKube`` (``fake_kube.py``), a stand-in cluster
that validates what it receives against the strict schema and runs the pods it is given.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import kubernetes_validate
import pytest
import yaml
from fake_kube import FakeKube
from live_airflow import wait_for
from trainer_corpus import write_corpus

from conftest import REPO, TINY, as_deployment, in_task, taxiway
from pipelines import run_folder
from pipelines.config import ConfigError, RunConfig, load_config
from pipelines.config.kubernetes import KubernetesConfig
from pipelines.launch import k8s
from pipelines.launch.spec import LaunchSpec, launch_spec

VERSIONS = ("1.28", kubernetes_validate.latest_version())
DIGEST = "registry.example.com/taxiway-trainer@sha256:" + "0123456789abcdef" * 4
BASE = [f"compute.kubernetes.image={DIGEST}", "compute.kubernetes.volume_claim=taxiway-home"]
GPU = ["compute.kubernetes.gpus=8", "compute.procs_per_node=8", "compute.backend=nccl",
       "compute.kubernetes.node_selector={nvidia.com/gpu.present: 'true'}",
       "compute.kubernetes.tolerations=[{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]",
       "compute.kubernetes.affinity={podAntiAffinity: {preferredDuringSchedulingIgnoredDuringExecution: "
       "[{weight: 100, podAffinityTerm: {topologyKey: kubernetes.io/hostname, labelSelector: "
       "{matchLabels: {app.kubernetes.io/name: taxiway-trainer}}}}]}}",
       "compute.kubernetes.secret_env=[{name: AWS_ACCESS_KEY_ID, secret: object-store, key: access-key-id}, "
       "{name: AWS_SECRET_ACCESS_KEY, secret: object-store, key: secret-access-key}]",
       "compute.kubernetes.secret_env_from=[hf-token]", "compute.kubernetes.env={NCCL_DEBUG: WARN}"]
RUN_ID = "manual__2026-01-01T00:00:00+00:00"
COMMAND = ["-m", "trainer", "--spec", "/taxiway/runs/manual__2026-01-01T00_00_00_00_00/train/spec.json"]
# Kubernetes' own rules (apimachinery validation), written out independently of the code under test
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")

CASES = [pytest.param(nodes, gpus, id=f"nodes={nodes}-{'gpu' if gpus else 'cpu'}") for nodes in (1, 2, 8)
         for gpus in (False, True)]


def config(nodes: int, gpus: bool, *more: str):
    return load_config(TINY, [*BASE, f"compute.nodes={nodes}", *(GPU if gpus else []), *more])


def launch(cfg: RunConfig, run_id: str = RUN_ID, try_number: int = 1) -> LaunchSpec:
    """The launch of ``run_id``'s try, its run folder where the pods see it (``COMMAND``'s)."""
    run_dir = run_folder.named_run_dir(run_id, home=PurePosixPath(cfg.compute.kubernetes.mount_path))
    return launch_spec(cfg, Path(run_dir), run_id, try_number)


def render(cfg: RunConfig, run_id: str = RUN_ID, try_number: int = 1) -> k8s.Gang:
    return k8s.render(launch(cfg, run_id, try_number), cfg.compute.kubernetes)


def validate(obj: dict[str, Any]) -> None:
    for version in VERSIONS:
        kubernetes_validate.validate(obj, version, strict=True)


def assert_valid_label(key: str, value: str) -> None:
    name = key.rpartition("/")[2]
    assert 0 < len(name) <= 63 and LABEL_VALUE.match(name), key
    assert len(value) <= 63 and LABEL_VALUE.match(value), f"{key}={value!r}"


# --- the pure function ------------------------------------------------------------------------

@pytest.mark.parametrize("nodes,gpus", CASES)
def test_objects_are_valid_and_carry_the_spec(nodes: int, gpus: bool):
    cfg = config(nodes, gpus)
    gang = render(cfg, RUN_ID, 3)
    for obj in gang.documents():
        validate(obj)
        for key, value in obj["metadata"]["labels"].items():
            assert_valid_label(key, value)
    job, svc, pod = gang.job, gang.service, gang.pod_spec
    assert DNS1035_LABEL.match(gang.service_name) and len(gang.service_name) <= 63
    assert all(DNS1123_LABEL.match(f"{gang.job_name}-{i}") and len(f"{gang.job_name}-{i}") <= 63
               for i in range(nodes))  # every pod's hostname

    # one pod per node, all or nothing, bounded in time
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"], spec["backoffLimit"]) == \
        ("Indexed", nodes, nodes, 0)
    assert spec["activeDeadlineSeconds"] == cfg.compute.timeout_s
    # rank 0 reachable as <job>-0.<service>: headless Service selecting exactly these pods
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    assert pod["subdomain"] == gang.service_name
    template_labels = spec["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= template_labels.items()
    assert template_labels["taxiway.dev/try-number"] == "3"
    assert LABEL_VALUE.match(template_labels["taxiway.dev/run-id"])
    assert spec["template"]["metadata"]["annotations"]["taxiway.dev/run-id"] == RUN_ID

    (container,) = pod["containers"]
    args = container["args"]
    assert container["command"] == ["torchrun"] and args[-len(COMMAND):] == COMMAND
    port = cfg.compute.kubernetes.rendezvous_port
    assert f"--rdzv-endpoint={gang.job_name}-0.{gang.service_name}:{port}" in args
    assert {"--rdzv-backend=c10d", f"--nnodes={nodes}", f"--nproc-per-node={8 if gpus else 1}",
            "--max-restarts=0"} <= set(args)
    env = {e["name"]: e for e in container["env"]}
    assert env["JOB_COMPLETION_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    assert env["TAXIWAY_NODE_RANK"]["value"] == "$(JOB_COMPLETION_INDEX)"
    assert env["TAXIWAY_HOME"]["value"] == "/taxiway"

    # resources: GPUs requested and limited only when asked for
    res = container["resources"]
    assert res["requests"]["memory"] == res["limits"]["memory"] == "64Gi"
    assert (res["requests"].get("nvidia.com/gpu"), res["limits"].get("nvidia.com/gpu")) == \
        (("8", "8") if gpus else (None, None))
    # /dev/shm in memory, the run folder on the PVC
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
    assert volumes[mounts["/taxiway"]]["persistentVolumeClaim"] == {"claimName": "taxiway-home"}
    # non-root, no escalation, nothing extra
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["automountServiceAccountToken"] is False and pod["restartPolicy"] == "Never"
    assert pod["terminationGracePeriodSeconds"] > cfg.compute.kubernetes.checkpoint_save_s
    assert container["imagePullPolicy"] == "IfNotPresent"  # pinned by digest
    if gpus:
        assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
        assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
        assert "podAntiAffinity" in pod["affinity"]
        assert container["envFrom"] == [{"secretRef": {"name": "hf-token"}}]


def test_secrets_only_by_reference():
    """Credentials arrive as secretKeyRef / envFrom.secretRef; no plain env var looks like a secret."""
    gang = render(config(2, True), RUN_ID, 1)
    env = gang.pod_spec["containers"][0]["env"]
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in env if "secretKeyRef" in e.get("valueFrom", {})}
    assert refs == {"AWS_ACCESS_KEY_ID": {"name": "object-store", "key": "access-key-id"},
                    "AWS_SECRET_ACCESS_KEY": {"name": "object-store", "key": "secret-access-key"}}
    plain = [e["name"] for e in env if "value" in e]
    assert not [n for n in plain if re.search(r"secret|password|token|key", n, re.I)], plain
    assert all(e["name"].startswith("TAXIWAY_") for e in env if "value" in e
               and e["name"] not in ("OMP_NUM_THREADS", "PYTHONUNBUFFERED", "NCCL_DEBUG"))


def test_strict_validation_catches_a_misplaced_field():
    """The schema check is real: an unknown field, or a field at the wrong level, fails it."""
    gang = render(config(2, False), RUN_ID, 1)
    bad = copy.deepcopy(gang.job)
    bad["spec"]["template"]["spec"]["containers"][0]["shmSize"] = "1Gi"
    with pytest.raises(kubernetes_validate.ValidationError, match="shmSize"):
        kubernetes_validate.validate(bad, VERSIONS[-1], strict=True)
    bad = copy.deepcopy(gang.job)
    bad["spec"]["completions"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError, match="two"):
        kubernetes_validate.validate(bad, VERSIONS[-1], strict=True)
    bad = copy.deepcopy(gang.service)
    bad["spec"]["headless"] = True
    with pytest.raises(kubernetes_validate.ValidationError, match="headless"):
        kubernetes_validate.validate(bad, VERSIONS[0], strict=True)


@pytest.mark.parametrize("sets,field,reason", [
    (["compute.kubernetes.image=registry.example.com/taxiway-trainer:latest"], "compute.kubernetes.image", "latest"),
    (["compute.kubernetes.image=registry.example.com:5000/taxiway-trainer"], "compute.kubernetes.image", "no tag"),
    (["compute.kubernetes.image=registry.example.com/t:0a1b2c3", "compute.kubernetes.require_digest=true"],
     "compute.kubernetes.image", "digest"),
    (["compute.kubernetes.env={AWS_SECRET_ACCESS_KEY: hunter2}"], "compute.kubernetes.env", "secret_env"),
    (["compute.kubernetes.env={DB_PASSWORD: hunter2}"], "compute.kubernetes.env", "looks like a secret"),
    (["compute.kubernetes.env={TAXIWAY_HOME: /elsewhere}"], "compute.kubernetes.env", "reserved"),
    (["compute.kubernetes.termination_grace_s=100", "compute.kubernetes.checkpoint_save_s=120"],
     "compute.kubernetes", "must be longer than checkpoint_save_s"),
    (["compute.kubernetes.labels={team: -ml-}"], "compute.kubernetes.labels", "alphanumeric at both ends"),
    (["compute.kubernetes.labels={cost-center: " + "x" * 64 + "}"], "compute.kubernetes.labels", "63"),
    (["compute.kubernetes.labels={taxiway.dev/run-id: mine}"], "compute.kubernetes.labels", "reserved"),
    (["compute.kubernetes.node_selector={'bad key!': x}"], "compute.kubernetes.node_selector", "label key"),
    (["compute.kubernetes.memory=64 GB"], "compute.kubernetes.memory", "pattern"),
    (["compute.kubernetes.affinity={nodeAfinity: {}}"], "compute.kubernetes.affinity", "nodeAfinity"),
    (["compute.kubernetes.gpus=8"], "compute", "procs_per_node (1) must equal kubernetes.gpus (8)"),
    (["compute.launcher=kubernetes", "compute.kubernetes.image=null"], "compute", "kubernetes.image"),
    (["compute.launcher=kubernetes", "compute.cancel_grace_s=400"], "compute",
     "cancel_grace_s (400) <= kubernetes.termination_grace_s (300)"),
    (["compute.launcher=kubernetes", "compute.kubernetes.checkpoint_save_s=150"], "compute",
     "checkpoint_save_s (150) < cancel_grace_s (120)"),
])
def test_refusals_name_the_field(sets: list[str], field: str, reason: str):
    with pytest.raises(ConfigError) as err:
        load_config(TINY, [*BASE, *sets])
    assert field in err.value.errors, err.value.errors
    assert reason in err.value.errors[field]


def test_render_refuses_an_incomplete_config():
    cfg = load_config(TINY)  # launcher local: no image, no volume yet
    with pytest.raises(ConfigError) as err:
        render(cfg, RUN_ID, 1)
    assert set(err.value.errors) == {"compute.kubernetes.image", "compute.kubernetes.volume_claim"}


@pytest.mark.parametrize("run_id", [
    RUN_ID, "scheduled__2026-01-01T00:00:00+00:00", "manual__2026-01-01T00:00:00.123456+00:00_aBcDeF12",
    "--weird--", "ünïcödé", "a" * 250, "a" * 250 + "b", "x", "_", "..", "dataset_triggered__2026-01-01T00:00:00+00:00",
])
def test_names_and_labels_are_valid_for_any_run_id(run_id: str):
    value = k8s.label_value(run_id)
    assert len(value) <= 63 and LABEL_VALUE.match(value) and value
    for try_number in (1, 12, 999):
        job, svc = k8s.names(run_id, try_number)
        assert DNS1035_LABEL.match(svc) and len(svc) <= 63
        assert DNS1123_LABEL.match(job) and len(f"{job}-9999") <= 63
    gang = render(config(8, False), run_id, 1)
    validate(gang.job)


def test_distinct_run_ids_get_distinct_names():
    ids = [RUN_ID, RUN_ID.replace("+", "_"), "a" * 250, "a" * 250 + "b", "A", "a"]
    assert len({k8s.names(i, 1) for i in ids}) == len(ids)
    assert len({k8s.label_value(i) for i in ("a" * 250, "a" * 250 + "b")}) == 2


def test_yaml_is_what_kubectl_reads():
    """Multi-document, Service first, no YAML aliases; loads back to the same objects."""
    gang = render(config(2, True), RUN_ID, 1)
    text = gang.to_yaml()
    assert "&id" not in text and "*id" not in text
    assert list(yaml.safe_load_all(text)) == gang.documents()


def test_render_k8s_cli(home: Path):
    out = taxiway("render-k8s", "--config", str(TINY), *sum((["--set", s] for s in BASE + GPU), []),
                  "--run-id", RUN_ID, "--nodes", "8", check=True)
    docs = list(yaml.safe_load_all(out.stdout))
    assert [d["kind"] for d in docs] == ["Service", "Job"]
    for doc in docs:
        validate(doc)
    job = docs[1]
    assert job["spec"]["completions"] == 8
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[-4:] == COMMAND  # the pods' run folder: mount_path/runs/<safe run id>
    bad = taxiway("render-k8s", "--config", str(TINY), "--set", "compute.kubernetes.image=taxiway-trainer:latest")
    assert bad.returncode == 2 and "compute.kubernetes.image" in bad.stderr and bad.stdout == ""


def test_shipped_kubernetes_config_renders(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TAXIWAY_TRAINER_IMAGE", DIGEST)
    cfg = load_config(REPO / "configs" / "kubernetes.yaml")
    gang = render(cfg, RUN_ID, 1)
    for obj in gang.documents():
        validate(obj)
    monkeypatch.setenv("TAXIWAY_TRAINER_IMAGE", "registry.example.com/taxiway-trainer:0a1b2c3")
    with pytest.raises(ConfigError, match="digest"):  # that config requires a digest
        load_config(REPO / "configs" / "kubernetes.yaml")


# --- through the provider's own path ------------------------------------------------------------

@pytest.fixture
def kube_connection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """An Airflow connection (from the environment) to a cluster that is not there."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "nowhere",
        "clusters": [{"name": "nowhere", "cluster": {"server": "https://127.0.0.1:9"}}],
        "users": [{"name": "nobody", "user": {}}],
        "contexts": [{"name": "nowhere", "context": {"cluster": "nowhere", "user": "nobody"}}]}))
    monkeypatch.setenv("AIRFLOW_CONN_TAXIWAY_TEST_K8S", json.dumps(
        {"conn_type": "kubernetes", "extra": {"kube_config_path": str(kubeconfig)}}))
    return "taxiway_test_k8s"


def assert_contains(outer: Any, inner: Any, where: str = "") -> None:
    """Everything ``inner`` says, ``outer`` says too (dicts may hold more; lists must match exactly)."""
    if isinstance(inner, dict):
        assert isinstance(outer, dict), where
        for key, value in inner.items():
            assert key in outer, f"{where}.{key} missing"
            assert_contains(outer[key], value, f"{where}.{key}")
    elif isinstance(inner, list):
        assert isinstance(outer, list) and len(outer) == len(inner), f"{where}: {outer} != {inner}"
        for i, (o, n) in enumerate(zip(outer, inner, strict=True)):
            assert_contains(o, n, f"{where}[{i}]")
    else:
        assert outer == inner, f"{where}: {outer!r} != {inner!r}"


@pytest.mark.parametrize("nodes,gpus", CASES)
def test_provider_builds_the_rendered_job(nodes: int, gpus: bool, kube_connection: str):
    from kubernetes.client import ApiClient

    from taxiway_airflow.operators.kubernetes import GangJob

    cfg = config(nodes, gpus, f"compute.kubernetes.connection_id={kube_connection}")
    gang = render(cfg, RUN_ID, 2)
    op = GangJob(task_id="gang", run={"run_dir": "/taxiway/runs/x"})
    op.adopt(gang, launch(cfg, RUN_ID, 2), cfg.compute.kubernetes.connection_id)
    built = ApiClient().sanitize_for_serialization(op.build_job_request_obj(None))
    validate(built)
    assert built["metadata"]["name"] == gang.job_name  # so <job>-0.<service> resolves
    assert_contains(built, gang.job, "job")
    assert built["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    pod = ApiClient().sanitize_for_serialization(op.pod_request_obj)
    validate(pod)
    assert_contains(pod["spec"], gang.pod_spec, "pod.spec")
    assert (op.completion_mode, op.completions, op.parallelism, op.backoff_limit) == ("Indexed", nodes, nodes, 0)
    assert op.deferrable and op.wait_until_job_complete and op.durable


def test_provider_dry_run_prints_the_pod(kube_connection: str, capsys: pytest.CaptureFixture[str]):
    from taxiway_airflow.operators.kubernetes import GangJob

    cfg = config(2, True, f"compute.kubernetes.connection_id={kube_connection}")
    gang = render(cfg, RUN_ID, 1)
    op = GangJob(task_id="gang", run={"run_dir": "/taxiway/runs/x"})
    op.adopt(gang, launch(cfg), cfg.compute.kubernetes.connection_id)
    op.dry_run()
    out = capsys.readouterr().out
    printed = yaml.safe_load(out[out.index("api_version: v1"):])  # after the operator's own log lines
    (container,) = printed["spec"]["containers"]
    assert container["image"] == DIGEST and container["args"][-4:] == COMMAND
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert printed["spec"]["subdomain"] == gang.service_name


def test_trigger_round_trips_through_serialization():
    """The triggerer rebuilds the trigger from its classpath; it must be ours (it deletes the Job on kill)."""
    import importlib

    from taxiway_airflow.triggers.kubernetes import GangJobTrigger

    trigger = GangJobTrigger(job_name="job-x-t1", job_namespace="taxiway", pod_names=["job-x-t1-0-abcde"],
                             pod_namespace="taxiway", base_container_name=k8s.CONTAINER,
                             kubernetes_conn_id="taxiway_test_k8s", run_key="taxiway_train/r", attempt=2,
                             pods=KubernetesConfig(namespace="team-a", gpus=8).model_dump(mode="json"),
                             report_every_s=30.0, watch={"run_dir": "/taxiway/runs/r", "started": 1.5e9,
                                                         "stall_timeout_s": 60.0, "startup_timeout_s": 600.0})
    path, kwargs = trigger.serialize()
    module, _, name = path.rpartition(".")
    again = getattr(importlib.import_module(module), name)(**kwargs)
    assert type(again) is GangJobTrigger and again.serialize() == (path, kwargs)


def test_run_folder_must_be_on_the_pods_volume(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from pipelines import stages
    from pipelines.errors import BadInput
    from taxiway_airflow.tasks.kubernetes import launch_for_run

    cases = ((["compute.launcher=kubernetes", f"compute.kubernetes.mount_path={home}"], None),
             (["compute.launcher=kubernetes"], "not under compute.kubernetes.mount_path"),  # mount_path /taxiway
             ([], "compute.launcher is 'local'"))
    for i, (sets, why) in enumerate(cases):
        cfg = load_config(TINY, [*BASE, *sets])
        as_deployment(cfg, tmp_path, monkeypatch)
        with in_task("taxiway_train", f"r{i}") as run_dir:
            stages.prepare.prepare(cfg, run_dir)
            if why is None:
                cfg, spec = launch_for_run({}, f"r{i}", 1)
                gang = k8s.render(spec, cfg.compute.kubernetes)
                assert gang.pod_spec["containers"][0]["args"][-1] == str(run_dir / "train" / "spec.json")
            else:
                with pytest.raises(BadInput, match=why):
                    launch_for_run({}, f"r{i}", 1)


# --- the DAG, parsed for a Kubernetes deployment -----------------------------------------------

def _parse_dag(launcher: str, **env: str) -> dict[str, Any]:
    """Parse the DAG folder in a fresh interpreter with TAXIWAY_LAUNCHER set, as the DAG processor would."""
    code = f"""
import json, sys
sys.path.insert(0, {str(REPO / 'plugins')!r})
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder={str(REPO / 'dags')!r})
out = {{"errors": {{k: str(v)[-600:] for k, v in bag.import_errors.items()}},
        "provider_job_imported": "airflow.providers.cncf.kubernetes.operators.job" in sys.modules}}
for dag_id, key in (("taxiway_train", "tasks"), ("taxiway_sweep", "sweep_tasks")):
    dag = bag.dags.get(dag_id)
    if dag is not None:
        out[key] = {{t.task_id: {{"type": type(t).__name__, "upstream": sorted(t.upstream_task_ids),
                     "setup": t.is_setup, "teardown": t.is_teardown,
                     "attrs": {{a: getattr(t, a, None) for a in ("completion_mode", "backoff_limit", "deferrable",
                               "wait_until_job_complete", "durable", "retries", "retry_exponential_backoff",
                               "retry_delay")}}}}
                    for t in dag.tasks}}
print(json.dumps(out, default=str))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**os.environ, "TAXIWAY_LAUNCHER": launcher, **env})
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_dag_parses_for_kubernetes_with_setup_and_teardown():
    parsed = _parse_dag("kubernetes")
    assert parsed["errors"] == {}
    tasks = parsed["tasks"]
    service, gang, teardown = tasks["train.service"], tasks["train.gang"], tasks["train.teardown"]
    assert service["setup"] and teardown["teardown"] and not gang["setup"] and not gang["teardown"]
    assert gang["type"] == "GangJob"
    assert gang["attrs"]["completion_mode"] == "Indexed" and gang["attrs"]["backoff_limit"] == 0
    assert gang["attrs"]["deferrable"] and gang["attrs"]["wait_until_job_complete"] and gang["attrs"]["durable"]
    assert gang["attrs"]["retries"] >= 1
    assert gang["attrs"]["retry_delay"] == "0:00:01"  # [taxiway] gang_retry_delay_s, as conftest sets it
    assert "train.smoke" in service["upstream"]
    assert "train.service" in gang["upstream"]
    assert {"train.gang", "train.service"} <= set(teardown["upstream"])
    assert "train.gang" in tasks["train.final_checkpoint"]["upstream"]
    assert not any(t["type"] == "TrainGang" for t in tasks.values())
    # a sweep's members train on the same launcher: each mapped member has its Service, Job and teardown
    member = {k.removeprefix("sweep.member."): t for k, t in parsed["sweep_tasks"].items() if k.startswith("sweep.member.")}
    assert member["gang"]["type"] == "GangJob" and member["service"]["setup"] and member["teardown"]["teardown"]
    assert "sweep.member.smoke" in member["service"]["upstream"] and "sweep.member.gang" in member["final_checkpoint"]["upstream"]
    assert "sweep.member.final_checkpoint" in member["score"]["upstream"]
    assert not any(t["type"] == "TrainGang" for t in parsed["sweep_tasks"].values())


def test_dag_for_local_deployments_is_unchanged_and_skips_the_provider():
    parsed = _parse_dag("local")
    assert parsed["errors"] == {}
    assert "train.service" not in parsed["tasks"] and parsed["tasks"]["train.gang"]["type"] == "TrainGang"
    assert parsed["sweep_tasks"]["sweep.member.gang"]["type"] == "TrainGang"
    assert parsed["tasks"]["train.gang"]["attrs"]["retry_delay"] == "0:00:01"  # [taxiway] gang_retry_delay_s
    assert parsed["provider_job_imported"] is False  # about a second of parse time saved


def test_unknown_launcher_is_an_import_error():
    parsed = _parse_dag("kubernets")
    assert any("TAXIWAY_LAUNCHER" in err for err in parsed["errors"].values()), parsed["errors"]
    parsed = _parse_dag("local", AIRFLOW__TAXIWAY__GANG_RETRY_DELAY_S="-5")  # the deployment's own, checked
    assert any("[taxiway] gang_retry_delay_s = -5: expected seconds from 0 to 600" in err
               for err in parsed["errors"].values()), parsed["errors"]


def test_both_launchers_answer_the_one_protocol():
    """``Launcher`` and ``Cluster`` as the operators rely on them: each launcher has the five calls, and the
    provider hook's cluster has every call a Kubernetes launcher makes."""
    from pipelines.launch import Launcher
    from pipelines.launch.cluster import Cluster
    from pipelines.launch.launchers import KubernetesLauncher, LocalLauncher
    from taxiway_airflow.hooks.kubernetes import HookCluster

    cluster = HookCluster(hook=None)
    assert isinstance(cluster, Cluster)
    assert isinstance(LocalLauncher(), Launcher) and isinstance(KubernetesLauncher(cluster, config(1, False).compute.kubernetes), Launcher)


# --- the operator's calls, against a stand-in API server -----------------------------------------

class _Store:
    """Airflow 3.3's ``task_state_store`` as an operator sees it: per task instance, across tries."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def set(self, key: str, value: Any, **kwargs: Any) -> None:
        self.data[key] = value


class _TI:
    """The task instance fields the operator reads (labels, try number) and its XCom pushes."""

    def __init__(self, try_number: int, dag_id: str = "taxiway_train", task_id: str = "train.gang",
                 map_index: int = -1) -> None:
        self.dag_id, self.task_id, self.map_index, self.try_number = dag_id, task_id, map_index, try_number
        self.xcom: dict[str, Any] = {}
        self.stats_tags: dict[str, str] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcom[key] = value


def _context(try_number: int, store: _Store, **ti: Any) -> dict[str, Any]:
    from types import SimpleNamespace

    return {"ti": _TI(try_number, **ti), "run_id": RUN_ID, "dag": SimpleNamespace(), "task_state_store": store}


def _first_event(trigger: Any, timeout_s: float = 120.0) -> dict[str, Any]:
    import asyncio

    async def first() -> dict[str, Any]:
        async for event in trigger.run():
            return event.payload
        raise AssertionError("trigger ended without an event")

    return asyncio.run(asyncio.wait_for(first(), timeout_s))


@pytest.fixture
def fake_kube(tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch):
    kube = FakeKube(tmp_path / "kube", volumes={"taxiway-home": home})
    kubeconfig = kube.kubeconfig(tmp_path / "kubeconfig")
    monkeypatch.setenv("AIRFLOW_CONN_TAXIWAY_FAKE_K8S", json.dumps(
        {"conn_type": "kubernetes", "extra": {"kube_config_path": str(kubeconfig)}}))
    yield kube
    kube.close()


@contextlib.contextmanager
def _tokenized_run(dag_id: str, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[RunConfig, Path]]:
    """A prepared and tokenized run folder under the pods' mount path (this test's TAXIWAY_HOME), 1 node, 6
    steps, as a task of run ``RUN_ID`` of ``dag_id`` finds it (its config the deployment's); the test runs in
    that task."""
    from pipelines import stages, tokenize
    from trainer import fsio

    cfg = load_config(TINY, [*BASE, *write_corpus(home / "corpus"), "train.steps=6", "checkpoint.every_steps=3", "compute.nodes=1",
                             "compute.launcher=kubernetes", f"compute.kubernetes.mount_path={home}",
                             "compute.kubernetes.connection_id=taxiway_fake_k8s"])
    as_deployment(cfg, tmp_path, monkeypatch)
    with in_task(dag_id, RUN_ID) as run_dir:
        stages.prepare.prepare(cfg, run_dir)
        packed = tokenize.pack_splits(cfg).path
        fsio.write_json(run_dir / "tokenize" / "packed.json", {"path": str(packed), "key": "k", "cache_hit": False})
        yield cfg, run_dir


@pytest.fixture
def k8s_run(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``_tokenized_run`` of ``taxiway_train``, as the run's tasks take it."""
    with _tokenized_run("taxiway_train", home, tmp_path, monkeypatch) as (cfg, _):
        yield {"config_sha256": cfg.sha256()}


def test_failed_try_is_replaced_cancel_deletes_and_teardown_leaves_nothing(k8s_run: dict[str, str],
                                                                           fake_kube: FakeKube):
    import asyncio

    from airflow.sdk.exceptions import AirflowException, TaskDeferred

    from taxiway_airflow.operators.kubernetes import GangJob
    from taxiway_airflow.tasks.kubernetes import create_service, delete_everything
    from taxiway_airflow.triggers.kubernetes import GangJobTrigger

    fake_kube.run_pods = False  # the test decides how each Job ends
    job_1, service = k8s.names(RUN_ID, 1)
    job_2, job_3 = k8s.names(RUN_ID, 2)[0], k8s.names(RUN_ID, 3)[0]
    create_service(k8s_run, RUN_ID)
    store = _Store()

    op, ctx = GangJob(task_id="gang", run=k8s_run, job_poll_interval=0.2), _context(1, store)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(ctx)
    fake_kube.set_job_condition(job_1, "Failed")  # a node failed: backoffLimit 0 fails the Job
    event = _first_event(deferred.value.trigger)
    with pytest.raises(AirflowException, match="TestFailed"):
        GangJob(task_id="gang", run=k8s_run).execute_complete(ctx, event)

    # the retry removes the failed try's Job (and its pods) before starting its own
    with pytest.raises(TaskDeferred) as deferred:
        GangJob(task_id="gang", run=k8s_run, job_poll_interval=0.2).execute(_context(2, store))
    assert set(fake_kube.of("Job")) == {job_2}
    assert {p["metadata"]["labels"]["taxiway.dev/try-number"] for p in fake_kube.of("Pod").values()} == {"2"}

    # the user fails the deferred task: the triggerer's on_kill deletes the Job in the foreground:
    # the Job stays, marked, until its pods have had their grace period and are gone; then it goes.
    # The trigger here is one serialized before it carried the run's pod config (still deferred across
    # an upgrade): it cancels all the same (the live Kubernetes test cancels through a current one)
    _, kwargs = deferred.value.trigger.serialize()
    assert kwargs.pop("pods")["namespace"] == "taxiway"
    asyncio.run(GangJobTrigger(**kwargs).on_kill())
    assert "deletionTimestamp" in fake_kube.of("Job")[job_2]["metadata"]
    wait_for("the Job and its pods to go", lambda: not fake_kube.of("Job") and not fake_kube.of("Pod"), 60, every_s=0.2)

    # a later try runs; the teardown removes its Job, its pods and the Service
    with pytest.raises(TaskDeferred):
        GangJob(task_id="gang", run=k8s_run, job_poll_interval=0.2).execute(_context(3, store))
    assert set(fake_kube.of("Job")) == {job_3} and len(fake_kube.of("Pod")) == 1
    assert delete_everything(k8s_run, RUN_ID) == 1
    assert not fake_kube.of("Job") and not fake_kube.of("Pod") and not fake_kube.of("Service")
    assert fake_kube.created == [f"Service/{service}", f"Job/{job_1}", f"Job/{job_2}", f"Job/{job_3}"]


def test_cluster_calls_ride_out_an_unavailable_api_server_and_a_conflict_is_not_retried(
        k8s_run: dict[str, str], fake_kube: FakeKube):
    """Every cluster call goes through the provider's retry wrapper: a 503 is retried until the API
    server answers; a 409 on create is the answer (the Service exists), never a retry."""
    from taxiway_airflow.tasks.kubernetes import create_service, delete_everything

    _, service = k8s.names(RUN_ID, 1)
    fake_kube.unavailable = 2
    assert create_service(k8s_run, RUN_ID)["service"] == service
    posts = [r for r in fake_kube.requests if r[0] == "POST"]
    assert len(posts) == 3 and set(fake_kube.of("Service")) == {service}, posts  # two 503s, then created
    before = len(fake_kube.requests)
    assert create_service(k8s_run, RUN_ID)["service"] == service  # 409: exists
    assert [r[0] for r in fake_kube.requests[before:]] == ["POST"]
    fake_kube.unavailable = 1
    assert delete_everything(k8s_run, RUN_ID) == 0 and not fake_kube.of("Service")


def test_a_sweeps_members_train_side_by_side_on_the_kubernetes_launcher(home: Path, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        fake_kube: FakeKube):
    """Two members of one sweep (one Airflow run): each member's setup, ``GangJob`` and teardown, as the
    mapped member group runs them, on pods the stand-in cluster really runs. Each member's Service and Job
    are named for the member, so both gangs train at once; each trains its own folder with its own point;
    each teardown removes its member's objects only."""
    from airflow.sdk import DAG
    from airflow.sdk.exceptions import TaskDeferred

    from pipelines import stages
    from pipelines.run_folder import RunFolder
    from pipelines.sweep import members, points
    from taxiway_airflow.operators.kubernetes import GangJob
    from taxiway_airflow.tasks.kubernetes import create_service, delete_everything, gang_name
    from trainer import fsio

    with _tokenized_run("taxiway_sweep", home, tmp_path, monkeypatch) as (cfg, run_dir):
        fsio.write_json(RunFolder(run_dir).preflight_report, {"passed": True, "checks": {}})
        points.write(run_dir, points.members(cfg, [{"train.lr": 0.001}, {"train.lr": 0.0003}]))
        listed = [{"member": m["member"]} for m in members.write(run_dir, "k")]  # the XCom the group maps over
        names = [k8s.names(gang_name(m, RUN_ID), 1) for m in listed]
        assert len({n for pair in names for n in pair}) == 4, names  # two Jobs, two Services
        stores, deferred = [_Store(), _Store()], []  # a task instance's own: each mapped member has one
        ops = []
        for m in listed:  # each mapped task instance is an operator of its own
            with DAG("taxiway_sweep", schedule=None):
                ops.append(GangJob(task_id="sweep.member.gang", run=m, job_poll_interval=0.2))
        for i, (m, op) in enumerate(zip(listed, ops, strict=True)):
            assert create_service(m, RUN_ID)["service"] == names[i][1]
            with pytest.raises(TaskDeferred) as caught:
                op.execute(_context(1, stores[i], dag_id="taxiway_sweep", task_id="sweep.member.gang", map_index=i))
            deferred.append(caught.value.trigger)
        assert set(fake_kube.of("Job")) == {names[0][0], names[1][0]}  # both gangs at once
        for i, (m, op, trigger) in enumerate(zip(listed, ops, deferred, strict=True)):
            event = _first_event(trigger)
            assert event["status"] == "success", event
            ctx = _context(1, stores[i], dag_id="taxiway_sweep", task_id="sweep.member.gang", map_index=i)
            model_dir = Path(op.execute_complete(ctx, event)["model_dir"])
            member_dir = members.member_dir(run_dir, m["member"])
            assert model_dir == RunFolder(member_dir).model and (model_dir / "model.safetensors").is_file()
            assert stages.prepare.load_run_config(member_dir).train.lr == (0.001, 0.0003)[i]
            assert RunFolder(member_dir).read_status()["step"] == 6
        assert delete_everything(listed[0], RUN_ID) == 1
        assert set(fake_kube.of("Job")) == {names[1][0]} and set(fake_kube.of("Service")) == {names[1][1]}
        assert delete_everything(listed[1], RUN_ID) == 1
        assert not fake_kube.of("Job") and not fake_kube.of("Pod") and not fake_kube.of("Service")
