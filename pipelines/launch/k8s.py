"""Kubernetes objects of a training gang: an Indexed Job (one pod per node) and a headless Service.

A pure function of the ``LaunchSpec`` (nodes, processes, threads, the launch's name and try, the
trainer command) and the config's ``compute.kubernetes`` (image, volume, resources): no cluster access
and no Airflow, so the same objects are printed by ``taxiway render-k8s`` (for
``kubectl apply --dry-run=server``), validated against the Kubernetes OpenAPI schemas in tests and
created by ``KubernetesLauncher`` through the provider's ``KubernetesJobOperator``.

How the gang finds itself: the Job runs ``completions = parallelism = nodes`` pods with
``completionMode: Indexed``; each pod's hostname is ``<job>-<index>`` and, with ``subdomain`` set
to the headless Service, rank 0 is reachable as ``<job>-0.<service>``, the torchrun c10d
rendezvous endpoint. c10d orders nodes by address, and ``<job>-0`` sorts first, so global rank 0
(the one that writes ``status.json`` and checkpoints' metadata) runs on pod 0, which also hosts the
rendezvous store. ``backoffLimit: 0``: a failed node fails the Job (the controller then stops the
other pods); Airflow's retry relaunches the whole gang, which resumes from the newest valid
checkpoint.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

import yaml

from pipelines.config import ConfigError, check_label
from pipelines.config.kubernetes import KubernetesConfig
from pipelines.errors import BadInput
from pipelines.launch.spec import LaunchSpec

CONTAINER = "trainer"
APP_LABELS = {"app.kubernetes.io/name": "taxiway-trainer", "app.kubernetes.io/part-of": "taxiway"}
GANG_LABEL = "taxiway.dev/gang"            # the Service name: one per run, selects every try's pods
RUN_LABEL = "taxiway.dev/run-id"
TRY_LABEL = "taxiway.dev/try-number"
RUN_ANNOTATION = "taxiway.dev/run-id"      # the raw run id (label values cannot hold ':' or '+')
INDEX_KEY = "batch.kubernetes.io/job-completion-index"  # the Job controller's own label and annotation
GPU = "nvidia.com/gpu"
_SLUG_MAX = 30   # "job-" + slug + "-" + 8 hex + "-t<try>" + "-<index>" must stay a 63-char hostname


@dataclass(frozen=True)
class Gang:
    """The objects of one try of one run; ``documents()`` in the order ``kubectl apply`` wants them."""

    service: dict[str, Any]
    job: dict[str, Any]

    def to_yaml(self) -> str:
        """Multi-document YAML, Service first, for ``kubectl apply -f -``."""
        return yaml.dump_all(self.documents(), Dumper=_PlainDumper, sort_keys=False)

    @property
    def job_name(self) -> str:
        return self.job["metadata"]["name"]

    @property
    def service_name(self) -> str:
        return self.service["metadata"]["name"]

    @property
    def namespace(self) -> str:
        return self.job["metadata"]["namespace"]

    @property
    def pod_spec(self) -> dict[str, Any]:
        return self.job["spec"]["template"]["spec"]

    @property
    def pod(self) -> dict[str, Any]:
        """The node pod as a Pod object: what the provider's Job operator builds its pods from."""
        template = self.job["spec"]["template"]
        return {"apiVersion": "v1", "kind": "Pod", "metadata": template["metadata"], "spec": template["spec"]}

    @property
    def job_shell(self) -> dict[str, Any]:
        """The Job whose pod template carries metadata only: the provider appends the list fields (env,
        volumes) of a full template to the pod it builds from ``pod``, so they would appear twice."""
        template = self.job["spec"]["template"]
        return {**self.job, "spec": {**self.job["spec"], "template": {"metadata": template["metadata"]}}}

    def documents(self) -> list[dict[str, Any]]:
        return [self.service, self.job]


def label_value(text: str) -> str:
    """``text`` as a valid label value: ≤ 63 chars of ``[A-Za-z0-9._-]``, alphanumeric at both ends.

    Too long a value keeps its head and gets a hash of the whole text, so distinct ids stay distinct.
    """
    value = re.sub(r"[^A-Za-z0-9._-]+", "_", text)
    value = re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", value)
    if len(value) > 63:
        value = re.sub(r"[^A-Za-z0-9]+$", "", value[:54]) + "-" + _digest(text)
    return value or "run"


def names(run_id: str, try_number: int) -> tuple[str, str]:
    """(Job name, Service name): DNS labels unique per run (and per try for the Job).

    The Service is a DNS-1035 label (starts with a letter); ``<job>-<index>`` must fit a 63-char
    hostname. The provider's ``KubernetesJobOperator`` prefixes Job names with ``job-``, so the Job
    name here carries that prefix and the operator is given the rest.
    """
    if try_number < 1:
        raise BadInput(f"try_number must be >= 1, got {try_number}")
    slug = re.sub(r"[^a-z0-9]+", "-", run_id.lower()).strip("-")[:_SLUG_MAX].strip("-") or "run"
    base = f"{slug}-{_digest(run_id)}"
    return f"job-{base}-t{try_number}", f"tw-{base}"


def render(spec: LaunchSpec, k: KubernetesConfig) -> Gang:
    """The Service and the Indexed Job that run ``torchrun … <spec.trainer_args()>`` on ``spec.nodes`` pods,
    named for ``spec.name`` and ``spec.try_number``.

    Paths in the trainer command must be under ``k.mount_path``, where the pods see TAXIWAY_HOME.
    """
    missing = {f"compute.kubernetes.{f}": "required to run on Kubernetes"
               for f in ("image", "volume_claim") if getattr(k, f) is None}
    if missing:
        raise ConfigError(missing)
    run_id, try_number = spec.name, spec.try_number
    job_name, service_name = names(run_id, try_number)
    if len(f"{job_name}-{spec.nodes - 1}") > 63:
        raise BadInput(f"pod hostname {job_name}-{spec.nodes - 1} exceeds 63 characters")
    labels = {**k.labels, **APP_LABELS, GANG_LABEL: service_name, RUN_LABEL: label_value(run_id)}
    for key, value in labels.items():
        if why := check_label(key, value):
            raise BadInput(why)
    try_labels = {**labels, TRY_LABEL: str(try_number)}
    annotations = {RUN_ANNOTATION: run_id}

    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": service_name, "namespace": k.namespace, "labels": labels,
                     "annotations": dict(annotations)},
        "spec": {
            "clusterIP": "None",
            "selector": {GANG_LABEL: service_name},
            # rank 0 must resolve while the pods start, before any readiness
            "publishNotReadyAddresses": True,
            "ports": [{"name": "rendezvous", "port": k.rendezvous_port, "targetPort": k.rendezvous_port,
                       "protocol": "TCP"}],
        },
    }
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": job_name, "namespace": k.namespace, "labels": try_labels, "annotations": annotations},
        "spec": {
            "completionMode": "Indexed",
            "completions": spec.nodes,
            "parallelism": spec.nodes,
            "backoffLimit": 0,
            "activeDeadlineSeconds": spec.timeout_s,
            "ttlSecondsAfterFinished": k.ttl_after_finished_s,
            "template": {
                "metadata": {"labels": dict(try_labels),
                             "annotations": {**annotations, "kubectl.kubernetes.io/default-container": CONTAINER}},
                "spec": _pod_spec(spec, k, job_name, service_name),
            },
        },
    }
    return Gang(service=service, job=job)


def _pod_spec(spec: LaunchSpec, k: KubernetesConfig, job_name: str, service_name: str) -> dict[str, Any]:
    args = [
        f"--nnodes={spec.nodes}",
        f"--nproc-per-node={spec.procs_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={job_name}-0.{service_name}:{k.rendezvous_port}",
        f"--rdzv-id={job_name}",
        f"--rdzv-conf=join_timeout={k.rendezvous_timeout_s}",
        "--max-restarts=0",  # restarts are the orchestrator's: the whole gang, from a checkpoint
        *spec.trainer_args(),
    ]
    env = [
        {"name": "JOB_COMPLETION_INDEX",
         "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{INDEX_KEY}']"}}},
        {"name": "TAXIWAY_NODE_RANK", "value": "$(JOB_COMPLETION_INDEX)"},
        {"name": "TAXIWAY_NODES", "value": str(spec.nodes)},
        {"name": "TAXIWAY_HOME", "value": k.mount_path},
        {"name": "TAXIWAY_RUN_ID", "value": spec.name},
        {"name": "TAXIWAY_TRY_NUMBER", "value": str(spec.try_number)},
        {"name": "OMP_NUM_THREADS", "value": str(spec.threads_per_proc)},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        *({"name": name, "value": value} for name, value in sorted(k.env.items())),
        *({"name": s.name, "valueFrom": {"secretKeyRef": {"name": s.secret, "key": s.key}}} for s in k.secret_env),
    ]
    requests = {"cpu": k.cpu, "memory": k.memory}
    limits = {"memory": k.memory, **({"cpu": k.cpu_limit} if k.cpu_limit else {})}
    if k.gpus:
        requests[GPU] = limits[GPU] = str(k.gpus)
    container = {
        "name": CONTAINER,
        "image": k.image,
        # a digest never changes; a tag might, so every node asks the registry for the same bytes
        "imagePullPolicy": "IfNotPresent" if "@sha256:" in (k.image or "") else "Always",
        "command": ["torchrun"],
        "args": args,
        "env": env,
        "ports": [{"name": "rendezvous", "containerPort": k.rendezvous_port, "protocol": "TCP"}],
        "resources": {"requests": requests, "limits": limits},
        "volumeMounts": [{"name": "taxiway-home", "mountPath": k.mount_path},
                         {"name": "dshm", "mountPath": "/dev/shm"}],
        "securityContext": {"allowPrivilegeEscalation": False, "privileged": False, "runAsNonRoot": True,
                            "capabilities": {"drop": ["ALL"]}},
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if k.secret_env_from:
        container["envFrom"] = [{"secretRef": {"name": name}} for name in k.secret_env_from]
    spec: dict[str, Any] = {
        "subdomain": service_name,
        "restartPolicy": "Never",
        "serviceAccountName": k.service_account,
        "automountServiceAccountToken": False,  # the trainer never talks to the Kubernetes API
        "terminationGracePeriodSeconds": k.termination_grace_s,
        "securityContext": {"runAsNonRoot": True, "runAsUser": k.run_as_user, "runAsGroup": k.run_as_group,
                            "fsGroup": k.fs_group, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
        "volumes": [{"name": "taxiway-home", "persistentVolumeClaim": {"claimName": k.volume_claim}},
                    {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": k.shm_size}}],
    }
    if k.node_selector:
        spec["nodeSelector"] = dict(k.node_selector)
    if k.tolerations:
        spec["tolerations"] = [_camel(t.model_dump(exclude_none=True)) for t in k.tolerations]
    if k.affinity:
        spec["affinity"] = k.affinity
    if k.priority_class:
        spec["priorityClassName"] = k.priority_class
    if k.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": name} for name in k.image_pull_secrets]
    return spec


class _PlainDumper(yaml.SafeDumper):
    """No ``&anchors``/``*aliases``: each object reads on its own."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _camel(d: dict[str, Any]) -> dict[str, Any]:
    return {re.sub(r"_([a-z])", lambda m: m.group(1).upper(), key): value for key, value in d.items()}


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]
