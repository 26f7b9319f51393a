"""``compute.kubernetes``: the pod spec of each training node, validated before any pod exists.

Rendered by ``pipelines/launch/k8s.py``; every rule here is one the API server or the kubelet
would enforce later, after the gang was already scheduled.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from pipelines.config.base import Section

_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_QUANTITY = r"^(\d+(\.\d+)?|\.\d+)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"
_ENV_NAME = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
_SECRETISH = re.compile(r"secret|passw|token|credential|private.?key|access.?key|api.?key|auth", re.I)
_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
DnsLabel = Annotated[str, Field(pattern=_DNS_LABEL, max_length=63)]
Quantity = Annotated[str, Field(pattern=_QUANTITY, max_length=32)]
Text = Annotated[str, Field(max_length=1024)]
MANY = 64  # most entries of a list or mapping in a pod spec (env vars, labels, tolerations, Secrets)


def check_label(key: str, value: str) -> str | None:
    """Why a Kubernetes label is invalid (None when valid): ``[prefix/]name`` ≤ 63, value ≤ 63."""
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not re.match(_DNS_SUBDOMAIN, prefix)):
        return f"label key prefix {prefix!r} is not a DNS subdomain"
    if not name or not _LABEL_VALUE.match(name):
        return f"label key name {name!r} must be 1-63 chars of [A-Za-z0-9._-], alphanumeric at both ends"
    if not _LABEL_VALUE.match(value):
        return "label value must be at most 63 chars of [A-Za-z0-9._-], alphanumeric at both ends"
    return None


class Toleration(Section):
    """A node taint the pods tolerate (the Kubernetes toleration fields)."""

    key: Text | None = None
    operator: Literal["Exists", "Equal"] = "Equal"
    value: Text | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = Field(None, ge=0, le=31_536_000, description="NoExecute only: how long the pod stays bound")


class SecretEnv(Section):
    """One environment variable read from a Secret key: the spec names the Secret, never holds the value."""

    name: str = Field(pattern=_ENV_NAME, max_length=253)
    secret: DnsLabel = Field(description="Secret name in the job's namespace")
    key: str = Field(min_length=1, max_length=253, description="Key inside the Secret")


class KubernetesConfig(Section):
    """Pod spec of each training node on Kubernetes (used when compute.launcher is kubernetes).

    Secrets are only ever referenced by name (secret_env, secret_env_from); the rendered objects
    carry no credential values, so they can be printed, logged and reviewed.
    """

    connection_id: str = Field("kubernetes_default", min_length=1, max_length=250,
                               description="Airflow connection holding the cluster credentials")
    namespace: DnsLabel = "taxiway"
    service_account: str = Field("taxiway-trainer", pattern=_DNS_SUBDOMAIN, max_length=253,
                                 description="Service account of the node pods (needs no API permissions)")
    require_digest: bool = Field(False, description="Refuse tag-pinned images too: only repo@sha256:<digest>")
    image: str | None = Field(
        None, max_length=1024, description="Trainer image (docker/trainer.Dockerfile), pinned: repo@sha256:<digest> (preferred) "
                          "or repo:<git-sha tag>; ':latest' and untagged images are refused")
    image_pull_secrets: list[DnsLabel] = Field([], max_length=MANY, description="Secret names for pulling from a private registry")
    cpu: Quantity = Field("8", description="CPU request per node pod")
    cpu_limit: Quantity | None = Field(
        None, description="CPU limit per node pod; None = no CFS quota (throttling slows data loading and NCCL)")
    memory: Quantity = Field("64Gi", description="Memory request and limit per node pod")
    gpus: Annotated[int, Field(ge=0, le=64)] = Field(0, description="nvidia.com/gpu per node pod (request = limit)")
    shm_size: Quantity = Field("16Gi", description="Size of /dev/shm (memory-medium emptyDir; counts as memory)")
    node_selector: dict[str, Text] = Field({}, max_length=MANY)
    tolerations: list[Toleration] = Field([], max_length=MANY)
    affinity: dict[str, Any] | None = Field(
        None, max_length=3, description="Pod affinity as in Kubernetes: nodeAffinity, podAffinity, podAntiAffinity")
    priority_class: str | None = Field(None, pattern=_DNS_SUBDOMAIN, max_length=253)
    volume_claim: DnsLabel | None = Field(
        None, description="PersistentVolumeClaim (ReadWriteMany) holding TAXIWAY_HOME: run folders, checkpoints, "
                          "packed data; Airflow workers mount the same volume at mount_path")
    mount_path: str = Field("/taxiway", pattern=r"^/[^:]*$", max_length=1024,
                            description="Where the volume is mounted in the pods: TAXIWAY_HOME there")
    secret_env: list[SecretEnv] = Field([], max_length=MANY, description="Env vars from Secret keys (e.g. object-store credentials)")
    secret_env_from: list[DnsLabel] = Field([], max_length=MANY, description="Secrets whose every key becomes an env var")
    env: dict[str, Text] = Field({}, max_length=MANY, description="Plain env vars (e.g. NCCL_SOCKET_IFNAME); never secrets")
    labels: dict[str, Text] = Field({}, max_length=MANY, description="Extra labels on the Job, its pods and the Service")
    run_as_user: Annotated[int, Field(ge=1, le=2_147_483_647)] = Field(10001, description="Non-root uid (the trainer image's)")
    run_as_group: Annotated[int, Field(ge=1, le=2_147_483_647)] = 10001
    fs_group: Annotated[int, Field(ge=1, le=2_147_483_647)] = Field(10001, description="Group owning the mounted volume's files")
    termination_grace_s: Annotated[int, Field(gt=0, le=86_400)] = Field(
        300, description="SIGTERM → SIGKILL window of a node pod; must exceed checkpoint_save_s")
    checkpoint_save_s: Annotated[int, Field(gt=0, le=86_400)] = Field(
        60, description="Longest checkpoint save on this cluster; a SIGTERMed node saves one before exiting")
    rendezvous_port: Annotated[int, Field(ge=1024, le=65535)] = Field(29400, description="torchrun c10d port")
    rendezvous_timeout_s: Annotated[int, Field(gt=0, le=86_400)] = Field(
        900, description="How long nodes wait for the whole gang to join (pods may start minutes apart)")
    ttl_after_finished_s: Annotated[int, Field(ge=0, le=31_536_000)] = Field(
        3600, description="A finished Job is garbage-collected after this, should teardown never run")

    @field_validator("image")
    @classmethod
    def _pinned(cls, image: str | None, info: ValidationInfo) -> str | None:
        if image is not None and (why := image_problem(image, info.data.get("require_digest", False))):
            raise ValueError(why)
        return image

    @field_validator("env")
    @classmethod
    def _no_plain_secrets(cls, env: dict[str, str]) -> dict[str, str]:
        for name in env:
            if not re.match(_ENV_NAME, name):
                raise ValueError(f"{name!r} is not a valid environment variable name")
            if name.startswith("TAXIWAY_") or name == "JOB_COMPLETION_INDEX":
                raise ValueError(f"{name} is reserved: the launcher sets it")
            if _SECRETISH.search(name):
                raise ValueError(f"{name} looks like a secret; reference it with secret_env (Secret name and "
                                 "key), never as a plain value")
        return env

    @field_validator("labels", "node_selector")
    @classmethod
    def _valid_labels(cls, labels: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        for key, value in labels.items():
            if why := check_label(key, value):
                raise ValueError(f"{key}: {why}")
            if info.field_name == "labels" and key.startswith("taxiway.dev/"):
                raise ValueError(f"{key}: the taxiway.dev/ prefix is reserved for the launcher's own labels")
        return labels

    @field_validator("affinity")
    @classmethod
    def _known_affinity(cls, affinity: dict[str, Any] | None) -> dict[str, Any] | None:
        if affinity and (unknown := set(affinity) - {"nodeAffinity", "podAffinity", "podAntiAffinity"}):
            raise ValueError(f"unknown keys {sorted(unknown)}: expected nodeAffinity, podAffinity, podAntiAffinity")
        return affinity

    @model_validator(mode="after")
    def _grace_covers_a_save(self) -> KubernetesConfig:
        if self.termination_grace_s <= self.checkpoint_save_s:
            raise ValueError(f"termination_grace_s ({self.termination_grace_s}) must be longer than "
                             f"checkpoint_save_s ({self.checkpoint_save_s}): a SIGTERMed node would be killed "
                             "mid-save")
        return self


def image_problem(image: str, require_digest: bool = False) -> str | None:
    """Why an image reference is not pinned (None when it is): digest preferred, a tag at least. The
    reason never quotes the reference (it may have been expanded from the environment)."""
    if _DIGEST.search(image):
        return None
    if require_digest:
        return "the image is not pinned by digest (require_digest is set): use repo@sha256:<digest>"
    name, sep, tag = image.rpartition(":")
    if not sep or "/" in tag:
        return "the image has no tag, so it means ':latest'; pin it: repo@sha256:<digest> or repo:<git-sha>"
    if tag.lower() == "latest":
        return "the image uses ':latest', which moves; pin it: repo@sha256:<digest> or repo:<git-sha>"
    if not _TAG.match(tag) or not name or name != name.lower():
        return "not a valid image reference (lowercase repository, tag of [A-Za-z0-9_.-])"
    return None
