"""The Kubernetes stand-in itself (tests/fake_kube.py) behaves as the cluster whose place it takes:
pods run their own command in their own network, hostname and environment, with their volumes; the Job
controller's conditions, exit codes, ``backoffLimit``, ``activeDeadlineSeconds`` and the termination
grace period are the API's. The launcher's tests rely on each of these, so each is pinned here."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import netns_pods
import psutil
import pytest
from fake_kube import FakeKube
from live_airflow import wait_for

pytestmark = pytest.mark.skipif(netns_pods.available() is not None, reason=str(netns_pods.available()))
NS = "ns"


@pytest.fixture
def kube(tmp_path: Path):
    kube = FakeKube(tmp_path / "kube", volumes={"shared": tmp_path / "shared"})
    (tmp_path / "shared").mkdir()
    kube.settle_s = 0.1
    yield kube
    kube.close()


def job(name: str, script: str, *, completions: int = 2, deadline_s: int | None = None, grace_s: int = 5) -> dict[str, Any]:
    """An Indexed Job whose pods run ``sh -c script`` with the shared volume at /data and one env var
    that refers to the downward API's completion index."""
    spec: dict[str, Any] = {
        "completionMode": "Indexed", "completions": completions, "parallelism": completions, "backoffLimit": 0,
        "template": {"metadata": {"labels": {"app": name}}, "spec": {
            "subdomain": "svc", "restartPolicy": "Never", "terminationGracePeriodSeconds": grace_s,
            "containers": [{"name": "main", "image": "busybox@sha256:" + "0" * 64, "command": ["sh", "-c"], "args": [script],
                            "workingDir": "/data",
                            "env": [{"name": "INDEX", "valueFrom": {"fieldRef": {
                                        "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}},
                                    {"name": "ME", "value": "pod-$(INDEX) $$(INDEX)"}],
                            "volumeMounts": [{"name": "data", "mountPath": "/data"}, {"name": "shm", "mountPath": "/dev/shm"}]}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "shared"}},
                        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Mi"}}]}}}
    if deadline_s is not None:
        spec["activeDeadlineSeconds"] = deadline_s
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": NS}, "spec": spec}


def create(kube: FakeKube, obj: dict[str, Any]) -> None:
    response = httpx.post(f"{kube.url}/apis/batch/v1/namespaces/{NS}/jobs", json=obj)
    assert response.status_code == 201, response.text


def conditions(kube: FakeKube, name: str) -> list[tuple[str, str]]:
    return [(c["type"], c["reason"]) for c in kube.of("Job")[name]["status"].get("conditions", [])]


def finished(kube: FakeKube, name: str) -> list[tuple[str, str]] | None:
    conds = conditions(kube, name)
    return conds if {"Complete", "Failed"} & {t for t, _ in conds} else None


def exit_codes(kube: FakeKube, name: str) -> list[int]:
    return [p["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] for p in kube.pods_of(name)]


def test_pods_run_their_command_in_a_network_host_and_environment_of_their_own(kube: FakeKube, tmp_path: Path,
                                                                                monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TAXIWAY_PLANTED", "from the test's own environment")
    # a pod's name resolves once that pod has its address: the other may not have one yet when this one
    # starts (as on a cluster: the trainer's rendezvous retries), so each waits until both names resolve
    create(kube, job("meet", 'until [ "$(getent hosts meet-0.svc meet-1.svc | wc -l)" = 2 ]; do sleep 0.1; done; '
                             'echo "$ME|$(hostname)|$PWD|$(getent hosts meet-0.svc meet-1.svc | tr "\\n" " ")|'
                             '${TAXIWAY_PLANTED:-none}|$(df -k /dev/shm | tail -1)" > out-$INDEX; sleep 1'))
    assert wait_for("the Job to finish", lambda: finished(kube, "meet"), 60, every_s=0.1) == [
        ("SuccessCriteriaMet", "CompletionsReached"), ("Complete", "CompletionsReached")]
    pods = kube.pods_of("meet")
    status = kube.of("Job")["meet"]["status"]
    assert (status["succeeded"], status["failed"], status["active"], status["completedIndexes"]) == (2, 0, 0, "0,1")
    assert exit_codes(kube, "meet") == [0, 0]
    addresses = [p["status"]["podIP"] for p in pods]
    assert len(set(addresses)) == 2
    for index in (0, 1):
        me, host, cwd, hosts, planted, shm = (tmp_path / "shared" / f"out-{index}").read_text().strip().split("|")
        assert (me, host, cwd, planted) == (f"pod-{index} $(INDEX)", f"meet-{index}", "/data", "none")
        assert hosts.split()[::4] == addresses and "meet-0.svc" in hosts  # both names, both addresses
        assert shm.split()[1] == "8192" and shm.startswith("tmpfs")        # a Memory emptyDir of its sizeLimit


def test_a_failed_pod_fails_the_job_after_the_others_had_their_sigterm(kube: FakeKube, tmp_path: Path):
    create(kube, job("fail", 'if [ "$INDEX" = 1 ]; then sleep 1; exit 3; fi; '
                             'trap "echo term > term-$INDEX; exit 0" TERM; while true; do sleep 0.1; done'))
    assert wait_for("the Job to fail", lambda: finished(kube, "fail"), 60, every_s=0.1) == [
        ("FailureTarget", "BackoffLimitExceeded"), ("Failed", "BackoffLimitExceeded")]
    assert (tmp_path / "shared" / "term-0").read_text() == "term\n"
    assert kube.of("Job")["fail"]["status"]["failed"] >= 1
    wait_for("pod 0 to go", lambda: len(kube.pods_of("fail")) == 1, 30, every_s=0.1)  # deleted by the controller
    assert exit_codes(kube, "fail") == [3]


def test_the_grace_period_ends_in_sigkill_and_the_deadline_fails_the_job(kube: FakeKube):
    create(kube, job("stubborn", 'setsid sleep 4242 & trap "" TERM; while true; do sleep 0.1; done', completions=1,
                     deadline_s=2, grace_s=1))
    started = time.monotonic()
    assert wait_for("the deadline", lambda: finished(kube, "stubborn"), 60, every_s=0.1) == [
        ("FailureTarget", "DeadlineExceeded"), ("Failed", "DeadlineExceeded")]
    assert time.monotonic() - started >= 3  # not before the 2 s deadline and the 1 s of ignored SIGTERM
    gone = wait_for("the pod to go", lambda: [p for p in kube.gone
                                              if p["metadata"]["labels"]["batch.kubernetes.io/job-name"] == "stubborn"], 10)
    assert gone[0]["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 137
    left = [cmd for p in psutil.process_iter(["cmdline"]) if (cmd := " ".join(p.info["cmdline"] or []))
            and ("sleep 4242" in cmd or 'trap "" TERM' in cmd)]
    assert not left, left  # every process of the container, the one in a session of its own included
