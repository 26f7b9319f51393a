"""A stand-in Kubernetes cluster whose pods run (issue 34): the API endpoints the launcher uses, over
real HTTP, with a Job controller, a garbage collector and a kubelet that follow the API's semantics.

A cluster cannot exist here; this is that boundary. Every object POSTed is validated against the
strict schema of the newest bundled Kubernetes version (what the operator really sends).

**The kubelet** runs each pod of an Indexed Job as real processes, from the pod's own ``command``,
``args``, ``env`` and ``workingDir`` (``$(VAR)`` expanded as Kubernetes does; ``valueFrom.fieldRef``
from the pod's metadata and status, ``secretKeyRef``/``envFrom`` from the stand-in's Secrets; no
variable of this machine's environment leaks in beyond the image's own ``PATH``), each pod in a
network, UTS and PID namespace of its own (``netns_pods.py``: its own address, hostname
``<job>-<index>``, and the names ``<job>-<index>.<service>`` of its subdomain resolvable in every pod
of it, as the cluster DNS answers for a headless Service with ``publishNotReadyAddresses``), with its
volumes mounted (``pod_entry.py``: a PersistentVolumeClaim as the folder the test binds to that claim,
an ``emptyDir`` of medium Memory as a tmpfs of its ``sizeLimit``). The PID namespace makes the
container's command its PID 1 and takes every process it started with it when it ends, those in
sessions of their own included (torchrun's workers), as a container runtime does. Every image is this machine's
virtualenv: the image's ``PATH`` is the venv's ``bin``. Pods run as root here (``runAsUser`` is not
applied: the run folders the test's Airflow writes belong to root).

**Pod phases** go Pending → Running (``podIP``, container ``running``) → Succeeded / Failed with the
container's exit code (128 + signal when a signal ended it) and reason, as the kubelet reports them.

**The Job controller**: ``status.active/ready/succeeded/failed/terminating``, ``completedIndexes``; a
failed pod beyond ``backoffLimit`` → ``FailureTarget`` (``BackoffLimitExceeded``), the remaining pods
terminated, then ``Failed`` once none runs; ``activeDeadlineSeconds`` → the same with
``DeadlineExceeded``; every index succeeded → ``SuccessCriteriaMet`` then ``Complete``;
``ttlSecondsAfterFinished`` → the Job deleted in the background. A pod deleted before it finished counts
as failed (pod-failure tracking with finalizers, Kubernetes ≥ 1.26).

**Deletion**: a pod is not removed at once: it is marked (``deletionTimestamp``), its container's
main process gets SIGTERM and ``terminationGracePeriodSeconds`` (or the request's
``gracePeriodSeconds``), then every process of the container gets SIGKILL, and the pod disappears
``settle_s`` after its container is gone (kubelet and API round trips). Deleting a ``batch/v1`` Job
without a ``propagationPolicy`` **orphans** its pods (they run on, unowned); ``Background`` removes
the Job now and its pods as above; ``Foreground`` keeps the Job (marked, with the
``foregroundDeletion`` finalizer) until every pod of it is gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import kubernetes_validate
import netns_pods
import psutil
import yaml

VERSION = kubernetes_validate.latest_version()
INDEX_KEY = "batch.kubernetes.io/job-completion-index"
POD_ENTRY = Path(__file__).with_name("pod_entry.py")
IMAGE_PATH = f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin"  # every image: this virtualenv
_TERMINAL = ("Succeeded", "Failed")


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class PodConfigError(Exception):
    """The container cannot be configured (a missing Secret or key): the pod waits, as the kubelet's
    ``CreateContainerConfigError``."""


class FakeKube:
    settle_s = 1.0

    def __init__(self, root: Path, *, volumes: dict[str, Path] | None = None,
                 secrets: dict[str, dict[str, str]] | None = None, image_env: dict[str, str] | None = None) -> None:
        """``root``: pod logs; ``volumes``: claim name → the folder that PersistentVolumeClaim holds;
        ``secrets``: Secret name → its data, for ``secretKeyRef``/``envFrom``; ``image_env``: the ``ENV``
        every image carries (a test's fault injection rides there, as no pod spec may set it)."""
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.volumes = volumes or {}
        self.secrets = secrets or {}
        self.image_env = image_env or {}
        self.gone: list[dict[str, Any]] = []                            # every pod removed, as it last was
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}   # (kind, namespace, name)
        self.created: list[str] = []                                    # "Kind/name", in order
        self.requests: list[tuple[str, str]] = []                       # (HTTP method, path?query), in order
        self.containers: dict[str, subprocess.Popen] = {}               # pod name → its container's main process
        self.pod_hosts: dict[str, netns_pods.Pod] = {}                  # pod name → its place on the pod network
        self.failed_pods: dict[tuple[str, str], set[str]] = {}          # (ns, job) → uids of its failed pods
        self.done_indexes: dict[tuple[str, str], set[int]] = {}         # (ns, job) → indexes that succeeded
        self.lock = threading.RLock()
        self.run_pods = True
        self.unavailable = 0  # the next N requests answer 503, as an API server whose control plane restarts
        self.on_request: Callable[[str, str], None] | None = None  # called before a request is served
        self.network: netns_pods.PodNetwork | None = None
        handler = type("Handler", (_Handler,), {"kube": self})
        self.server = _Server(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def kubeconfig(self, path: Path) -> Path:
        """A kubeconfig naming this API server (what an Airflow connection's ``kube_config_path`` points at)."""
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "u", "user": {}}], "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u"}}]}))
        return path

    def close(self) -> None:
        self.server.shutdown()
        for proc in list(self.containers.values()):
            _kill_group(proc)
        if self.network:
            self.network.close()

    # what tests look at and do ----------------------------------------------------------------
    def of(self, kind: str) -> dict[str, dict[str, Any]]:
        with self.lock:
            return {name: obj for (k, _, name), obj in self.objects.items() if k == kind}

    def pods_of(self, job: str) -> list[dict[str, Any]]:
        """The Job's pods, by completion index."""
        with self.lock:
            pods = [o for (k, _, _), o in self.objects.items() if k == "Pod"
                    and o["metadata"]["labels"].get("batch.kubernetes.io/job-name") == job]
        return sorted(pods, key=lambda p: int(p["metadata"]["labels"][INDEX_KEY]))

    def log(self, pod_name: str) -> str:
        path = self.root / f"{pod_name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def set_job_condition(self, name: str, condition: str) -> None:
        with self.lock:
            job = next(o for (k, _, n), o in self.objects.items() if k == "Job" and n == name)
            job["status"] = {"conditions": [_condition(condition, f"Test{condition}")]}

    def kill_container(self, pod_name: str) -> None:
        """Every process of the pod's container gets SIGKILL (the OOM killer, a node that lost power)."""
        _kill_group(self.containers[pod_name])

    def cut(self, pod_name: str) -> None:
        """The pod's node loses its network: its link goes down; it keeps running."""
        assert self.network is not None
        self.network.cut(self.pod_hosts[pod_name])

    # the Job controller -------------------------------------------------------------------------
    def start_job(self, job: dict[str, Any]) -> None:
        """Called under ``lock`` when a Job is created: one pod per completion index, then the kubelet."""
        ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
        meta = job["metadata"]
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now())
        job["status"] = {"startTime": now(), "active": 0, "ready": 0}
        self.failed_pods[(ns, name)], self.done_indexes[(ns, name)] = set(), set()
        template = job["spec"]["template"]
        owner = {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": meta["uid"],
                 "controller": True, "blockOwnerDeletion": True}
        for index in range(job["spec"]["completions"]):
            tmeta = template["metadata"]
            pod_name = f"{name}-{index}-{uuid.uuid4().hex[:5]}"
            pod = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": pod_name, "namespace": ns, "uid": str(uuid.uuid4()), "creationTimestamp": now(),
                                "ownerReferences": [owner], "finalizers": ["batch.kubernetes.io/job-tracking"],
                                "labels": {**tmeta.get("labels", {}), "batch.kubernetes.io/job-name": name,
                                           "batch.kubernetes.io/controller-uid": meta["uid"], INDEX_KEY: str(index)},
                                "annotations": {**tmeta.get("annotations", {}), INDEX_KEY: str(index)}},
                   "spec": {**template["spec"], "hostname": f"{name}-{index}", "nodeName": "fake-node"},
                   "status": {"phase": "Pending"}}
            self.objects[("Pod", ns, pod_name)] = pod
            if self.run_pods:
                threading.Thread(target=self._kubelet, args=(("Pod", ns, pod_name),), daemon=True).start()
            else:
                pod["status"] = {"phase": "Running"}
        if (deadline := job["spec"].get("activeDeadlineSeconds")) is not None:
            timer = threading.Timer(deadline, self._deadline, args=(ns, name, meta["uid"]))
            timer.daemon = True
            timer.start()
        self._sync(ns, name)

    def _sync(self, ns: str, name: str) -> None:
        """Called under ``lock``: the Job's status from its pods; conditions as the controller sets them."""
        job = self.objects.get(("Job", ns, name))
        if job is None:
            return
        status = job.setdefault("status", {})
        conditions = status.setdefault("conditions", [])
        kinds = {c["type"] for c in conditions}
        pods = self._pods_of(ns, name)
        running = [p for p in pods if p["status"]["phase"] not in _TERMINAL]
        active = [p for p in running if "deletionTimestamp" not in p["metadata"]]
        done, failed = self.done_indexes[(ns, name)], self.failed_pods[(ns, name)]
        status.update(active=len(active), terminating=len(running) - len(active), succeeded=len(done),
                      failed=len(failed), ready=sum(p["status"].get("phase") == "Running" for p in active),
                      completedIndexes=",".join(str(i) for i in sorted(done)))
        if "Complete" in kinds or "Failed" in kinds:
            return
        if "FailureTarget" not in kinds and len(failed) > job["spec"].get("backoffLimit", 6):
            self._fail(job, "BackoffLimitExceeded", "Job has reached the specified backoff limit")
            return
        if "FailureTarget" in kinds:
            if not running:
                target = next(c for c in conditions if c["type"] == "FailureTarget")
                conditions.append(_condition("Failed", target["reason"], target["message"]))
                self._finished(job)
            return
        if len(done) == job["spec"]["completions"]:
            conditions += [_condition("SuccessCriteriaMet", "CompletionsReached", "Reached expected number of succeeded pods"),
                           _condition("Complete", "CompletionsReached", "Reached expected number of succeeded pods")]
            status["completionTime"] = now()
            self._finished(job)

    def _fail(self, job: dict[str, Any], reason: str, message: str) -> None:
        """FailureTarget now; every running pod terminated; Failed once none runs (``_sync``)."""
        ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
        job["status"]["conditions"].append(_condition("FailureTarget", reason, message))
        for pod in self._pods_of(ns, name):
            if pod["status"]["phase"] not in _TERMINAL:
                self._terminate(("Pod", ns, pod["metadata"]["name"]))
        self._sync(ns, name)

    def _deadline(self, ns: str, name: str, uid: str) -> None:
        with self.lock:
            job = self.objects.get(("Job", ns, name))
            if job and job["metadata"]["uid"] == uid and not {c["type"] for c in job["status"]["conditions"]} \
                    & {"Complete", "Failed", "FailureTarget"}:
                self._fail(job, "DeadlineExceeded", "Job was active longer than specified deadline")

    def _finished(self, job: dict[str, Any]) -> None:
        ttl = job["spec"].get("ttlSecondsAfterFinished")
        if ttl is None:
            return
        ns, name, uid = job["metadata"]["namespace"], job["metadata"]["name"], job["metadata"]["uid"]

        def expire() -> None:
            with self.lock:
                current = self.objects.get(("Job", ns, name))
                if current and current["metadata"]["uid"] == uid:
                    self.delete("Job", ns, name, "Background")
        timer = threading.Timer(ttl, expire)
        timer.daemon = True
        timer.start()

    # the kubelet --------------------------------------------------------------------------------
    def _kubelet(self, key: tuple[str, str, str]) -> None:
        """Start the pod's one container, report it running, and its exit as the pod's phase."""
        _, ns, pod_name = key
        with self.lock:
            pod = self.objects.get(key)
            if pod is None or "deletionTimestamp" in pod["metadata"]:
                return
            spec = pod["spec"]
            if self.network is None:
                self.network = netns_pods.PodNetwork(f"{self.url}-{uuid.uuid4()}")
        host = self.network.add(spec["hostname"], spec.get("subdomain", "default-subdomain"), ns)
        container = spec["containers"][0]
        with self.lock:
            if key not in self.objects or "deletionTimestamp" in pod["metadata"]:
                self.network.remove(host)
                return
            self.pod_hosts[pod_name] = host
            pod["status"].update(podIP=host.address, podIPs=[{"ip": host.address}], hostIP="10.0.0.1",
                                 startTime=now())
            try:
                env = self._environment(pod, container)
            except PodConfigError as exc:
                pod["status"]["containerStatuses"] = [_container_status(container, {"waiting": {
                    "reason": "CreateContainerConfigError", "message": str(exc)}})]
                return
            argv = [_expand(a, env) for a in [*container.get("command", []), *container.get("args", [])]]
            entry = {"hostname": spec["hostname"], "mounts": self._mounts(spec, container), "env": env, "argv": argv,
                     "cwd": container.get("workingDir", "/")}
            log = open(self.root / f"{pod_name}.log", "ab")  # noqa: SIM115 - the container's stdout, kept open by it
            proc = subprocess.Popen(
                [*self.network.exec_prefix(host), "unshare", "--uts", "--pid", "--fork", "--kill-child", sys.executable,
                 str(POD_ENTRY), json.dumps(entry)],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
            log.close()
            self.containers[pod_name] = proc
            pod["status"].update(phase="Running", conditions=[{"type": "Ready", "status": "True"}],
                                 containerStatuses=[_container_status(container, {"running": {"startedAt": now()}},
                                                                      ready=True)])
            self._sync(ns, _job_of(pod))
        code = proc.wait()
        _kill_group(proc)  # the container is gone: so is every process it started (its PID namespace)
        exit_code = code if code >= 0 else 128 - code
        with self.lock:
            pod = self.objects.get(key)
            if pod is None:
                return
            reason = "Completed" if exit_code == 0 else "Error"
            pod["status"].update(phase="Succeeded" if exit_code == 0 else "Failed",
                                 conditions=[{"type": "Ready", "status": "False"}],
                                 containerStatuses=[_container_status(container, {"terminated": {
                                     "exitCode": exit_code, "reason": reason, "finishedAt": now(),
                                     **({"signal": -code} if code < 0 else {})}})])
            self._count(pod)

    def _count(self, pod: dict[str, Any]) -> None:
        """Called under ``lock`` when a pod ended or went: its Job counts it once."""
        ns, job = pod["metadata"]["namespace"], _job_of(pod)
        if (ns, job) not in self.failed_pods:
            return
        if pod["status"]["phase"] == "Succeeded":
            self.done_indexes[(ns, job)].add(int(pod["metadata"]["labels"][INDEX_KEY]))
        else:
            self.failed_pods[(ns, job)].add(pod["metadata"]["uid"])
        self._sync(ns, job)

    def _environment(self, pod: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
        """The container's environment as the kubelet builds it: the image's, ``envFrom``, then ``env`` in
        order, each ``$(VAR)`` expanded from those defined before it."""
        env = {"PATH": IMAGE_PATH, "HOME": "/root", **self.image_env, "HOSTNAME": pod["spec"]["hostname"]}
        for source in container.get("envFrom", []):
            env.update(self._secret(source["secretRef"]["name"]))
        for var in container.get("env", []):
            if "value" in var:
                env[var["name"]] = _expand(var["value"], env)
            elif ref := var["valueFrom"].get("fieldRef"):
                env[var["name"]] = _field(pod, ref["fieldPath"])
            elif ref := var["valueFrom"].get("secretKeyRef"):
                data = self._secret(ref["name"])
                if ref["key"] not in data:
                    raise PodConfigError(f"couldn't find key {ref['key']} in Secret {pod['metadata']['namespace']}/{ref['name']}")
                env[var["name"]] = data[ref["key"]]
        return env

    def _secret(self, name: str) -> dict[str, str]:
        if name not in self.secrets:
            raise PodConfigError(f'secret "{name}" not found')
        return self.secrets[name]

    def _mounts(self, spec: dict[str, Any], container: dict[str, Any]) -> list[dict[str, str]]:
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        mounts = []
        for mount in container.get("volumeMounts", []):
            volume = volumes[mount["name"]]
            if claim := volume.get("persistentVolumeClaim"):
                mounts.append({"kind": "bind", "source": str(self.volumes[claim["claimName"]]), "path": mount["mountPath"]})
            elif (empty := volume.get("emptyDir")) is not None and empty.get("medium") == "Memory":
                mounts.append({"kind": "tmpfs", "size": empty.get("sizeLimit", "64Mi").replace("i", ""),
                               "path": mount["mountPath"]})
            else:
                raise ValueError(f"volume {mount['name']}: only persistentVolumeClaim and emptyDir(Memory) are modelled")
        return mounts

    # deletion, as the API server, garbage collector and kubelet do it --------------------------
    def delete(self, kind: str, ns: str, name: str, policy: str | None, grace_s: float | None = None) -> dict[str, Any] | None:
        """Called under ``lock``. Returns the object when it stays (being deleted), None when it went."""
        key = (kind, ns, name)
        obj = self.objects[key]
        if kind == "Pod":
            self._terminate(key, grace_s)
            return obj
        if kind != "Job":
            del self.objects[key]
            return None
        pods = self._pods_of(ns, name)
        policy = policy or "Orphan"  # batch/v1 Jobs deleted through the API: the legacy default
        if policy == "Orphan":
            for pod in pods:
                pod["metadata"]["ownerReferences"] = []
            del self.objects[key]
            return None
        for pod in pods:
            self._terminate(("Pod", ns, pod["metadata"]["name"]), grace_s)
        if policy == "Foreground" and pods:
            obj["metadata"].update(deletionTimestamp=now(), finalizers=["foregroundDeletion"])
            return obj
        del self.objects[key]
        return None

    def _pods_of(self, ns: str, job: str) -> list[dict[str, Any]]:
        return [o for (k, n, _), o in self.objects.items() if k == "Pod" and n == ns
                and any(ref["kind"] == "Job" and ref["name"] == job for ref in o["metadata"].get("ownerReferences", []))]

    def _terminate(self, key: tuple[str, str, str], grace_s: float | None = None) -> None:
        pod = self.objects[key]
        if "deletionTimestamp" in pod["metadata"]:
            return
        grace = pod["spec"].get("terminationGracePeriodSeconds", 30) if grace_s is None else grace_s
        pod["metadata"].update(deletionTimestamp=now(), deletionGracePeriodSeconds=int(grace))
        self._sync(key[1], _job_of(pod))
        threading.Thread(target=self._kill_and_remove, args=(key, grace), daemon=True).start()

    def _kill_and_remove(self, key: tuple[str, str, str], grace_s: float) -> None:
        proc = self.containers.get(key[2])
        if proc and proc.poll() is None:
            try:
                os.kill(_main_process(proc), signal.SIGTERM)  # the container's PID 1, as the runtime signals it
                proc.wait(grace_s)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
            _kill_group(proc)
            proc.wait()
        time.sleep(self.settle_s)
        with self.lock:
            pod = self.objects.get(key)
            if pod is None:
                return
            if pod["status"]["phase"] not in _TERMINAL:  # never ran, or ended unseen: a failure to the Job
                pod["status"]["phase"] = "Failed"
                self._count(pod)
            del self.objects[key]
            self.gone.append(pod)
            if host := self.pod_hosts.pop(key[2], None):
                self.network.remove(host)
            self.containers.pop(key[2], None)
            for ref in pod["metadata"].get("ownerReferences", []):  # foreground: the owner goes last
                job = self.objects.get(("Job", key[1], ref["name"]))
                if job and "foregroundDeletion" in job["metadata"].get("finalizers", []) \
                        and not self._pods_of(key[1], ref["name"]):
                    del self.objects[("Job", key[1], ref["name"])]
                else:
                    self._sync(key[1], ref["name"])


def _condition(kind: str, reason: str, message: str = "") -> dict[str, str]:
    return {"type": kind, "status": "True", "reason": reason, "message": message,
            "lastProbeTime": now(), "lastTransitionTime": now()}


def _container_status(container: dict[str, Any], state: dict[str, Any], ready: bool = False) -> dict[str, Any]:
    return {"name": container["name"], "image": container["image"], "imageID": container["image"],
            "ready": ready, "restartCount": 0, "started": "running" in state, "state": state}


def _job_of(pod: dict[str, Any]) -> str:
    return pod["metadata"]["labels"].get("batch.kubernetes.io/job-name", "")


def _expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)``: a defined variable is replaced, an undefined one stays as written,
    ``$$`` is a literal ``$``."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


def _field(pod: dict[str, Any], path: str) -> str:
    """The downward API's ``fieldRef.fieldPath`` values the kubelet supports for env."""
    if m := re.fullmatch(r"metadata\.(annotations|labels)\['([^']+)'\]", path):
        return pod["metadata"].get(m.group(1), {}).get(m.group(2), "")
    simple = {"metadata.name": pod["metadata"]["name"], "metadata.namespace": pod["metadata"]["namespace"],
              "metadata.uid": pod["metadata"]["uid"], "spec.nodeName": pod["spec"]["nodeName"],
              "spec.serviceAccountName": pod["spec"].get("serviceAccountName", "default"),
              "status.podIP": pod["status"].get("podIP", ""), "status.hostIP": pod["status"].get("hostIP", "")}
    if path not in simple:
        raise PodConfigError(f"unsupported fieldPath {path!r}")
    return simple[path]


def _main_process(proc: subprocess.Popen) -> int:
    """The container's PID 1: the child ``unshare --fork`` started in the pod's PID namespace (the
    runtime's own process, ``proc``, while it has not started yet)."""
    for _ in range(50):
        with contextlib.suppress(psutil.Error):
            if children := psutil.Process(proc.pid).children():
                return children[0].pid
        if proc.poll() is not None:
            break
        time.sleep(0.02)
    return proc.pid


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the container: its runtime process (``--kill-child`` takes the pod's PID 1 with it, and the
    kernel every process of the PID namespace after that, those in sessions of their own included)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that died mid-request (a killed worker) is no error of the API server's."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    """/api/v1/namespaces/{ns}/{services,pods}[/{name}[/log]], /apis/batch/v1/namespaces/{ns}/jobs[/{name}[/status]]."""

    kube: FakeKube
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def _route(self) -> tuple[str, str, str | None, str | None, dict[str, str]]:
        self.kube.requests.append((self.command, self.path))
        if self.kube.on_request:
            self.kube.on_request(self.command, self.path)
        url = urlsplit(self.path)
        parts = url.path.strip("/").split("/")
        parts = parts[2:] if parts[0] == "api" else parts[3:]   # drop api/v1 or apis/batch/v1
        _, ns, plural, *rest = parts
        kind = {"services": "Service", "pods": "Pod", "jobs": "Job"}[plural]
        return kind, ns, (rest[0] if rest else None), (rest[1] if len(rest) > 1 else None), dict(parse_qsl(url.query))

    def _unavailable(self) -> bool:
        """Answer 503 while the test says the API server is unavailable (the request is still recorded)."""
        with self.kube.lock:
            if self.kube.unavailable <= 0:
                return False
            self.kube.unavailable -= 1
        self.kube.requests.append((self.command, self.path))
        self._body()  # read off the request body so the connection can carry the next request
        self._status(503, "ServiceUnavailable")
        return True

    def _send(self, code: int, body: Any) -> None:
        data = (body if isinstance(body, str) else json.dumps(body)).encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain" if isinstance(body, str) else "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length) or b"{}")

    def _status(self, code: int, reason: str) -> None:
        self._send(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code})

    def do_GET(self) -> None:
        if self._unavailable():
            return
        kind, ns, name, sub, query = self._route()
        kube = self.kube
        with kube.lock:
            if name is None:
                items = [o for (k, n, _), o in kube.objects.items() if k == kind and n == ns
                         and _selector_matches(query.get("labelSelector", ""), o["metadata"].get("labels", {}))]
                return self._send(200, {"apiVersion": "v1", "kind": f"{kind}List", "metadata": {}, "items": items})
            obj = kube.objects.get((kind, ns, name))
            if obj is None:
                return self._status(404, "NotFound")
            if sub == "log":
                return self._send(200, kube.log(name))
            return self._send(200, obj)

    def do_POST(self) -> None:
        if self._unavailable():
            return
        kind, ns, _, _, _ = self._route()
        body = self._body()
        kubernetes_validate.validate(body, VERSION, strict=True)
        kube = self.kube
        with kube.lock:
            key = (kind, ns, body["metadata"]["name"])
            if key in kube.objects:
                return self._status(409, "AlreadyExists")
            kube.objects[key] = body
            kube.created.append(f"{kind}/{body['metadata']['name']}")
            if kind == "Job":
                kube.start_job(body)
        self._send(201, body)

    def do_PATCH(self) -> None:
        if self._unavailable():
            return
        kind, ns, name, _, _ = self._route()
        patch = self._body()
        with self.kube.lock:
            obj = self.kube.objects.get((kind, ns, name))
            if obj is None:
                return self._status(404, "NotFound")
            obj["metadata"].setdefault("labels", {}).update(patch.get("metadata", {}).get("labels", {}))
        self._send(200, obj)

    def do_DELETE(self) -> None:
        if self._unavailable():
            return
        kind, ns, name, _, query = self._route()
        options = self._body()  # DeleteOptions may come as the body or as query parameters
        policy = query.get("propagationPolicy") or options.get("propagationPolicy")
        grace = query.get("gracePeriodSeconds", options.get("gracePeriodSeconds"))
        kube = self.kube
        with kube.lock:
            if (kind, ns, name) not in kube.objects:
                return self._status(404, "NotFound")
            staying = kube.delete(kind, ns, name, policy, None if grace is None else float(grace))
        self._send(200, staying or {"kind": "Status", "apiVersion": "v1", "status": "Success"})


def _selector_matches(selector: str, labels: dict[str, str]) -> bool:
    for term in filter(None, selector.split(",")):
        if term.startswith("!"):
            ok = term[1:] not in labels
        elif "!=" in term:
            key, value = term.split("!=")
            ok = labels.get(key) != value
        else:
            key, value = term.split("=")
            ok = labels.get(key) == value
        if not ok:
            return False
    return True
