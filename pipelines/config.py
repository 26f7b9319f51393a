"""RunConfig: the one validated, frozen description of a training run.

Everything that changes between experiments lives here; orchestration and execution only read it.
YAML files compose with ``extends:``, ``${VAR}`` expands from the environment, and dotted
``--set key=value`` overrides apply last. Errors name every bad field by its dotted path.
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from pipelines.errors import BadInput
from pipelines.roots import Roots
from pipelines.run_folder import taxiway_home

SECTIONS = (
    "name", "data", "preflight", "tokenizer", "pack", "model", "train",
    "checkpoint", "compute", "eval", "registry", "parent",
)

PositiveInt = Annotated[int, Field(gt=0)]
Fraction = Annotated[float, Field(ge=0.0, le=1.0)]


class ConfigError(BadInput):
    """A config that cannot be used; ``errors`` maps dotted field paths to reasons."""

    def __init__(self, errors: dict[str, str], source: str = "config") -> None:
        self.errors = errors
        lines = [f"invalid {source}:"] + [f"  {path}: {why}" for path, why in errors.items()]
        super().__init__("\n".join(lines))


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DataConfig(Section):
    """Where the raw text lives. Paths are local paths or fsspec URIs."""

    train: str = Field(description="Folder or glob of training documents")
    val: str = Field(description="Folder or glob of validation documents")
    manifest: str = Field(description="JSON Lines manifest: path, split, bytes, sha256 per file")
    format: Literal["txt", "jsonl", "parquet"] | None = Field(
        default=None, description="Input format; inferred from file extensions when unset")


class PreflightConfig(Section):
    """Gate thresholds checked before any compute is spent."""

    allow_unlisted: bool = Field(False, description="Accept data files missing from the manifest")
    min_chars: Annotated[int, Field(ge=0)] = Field(1, description="Shortest document accepted (characters)")
    max_chars: PositiveInt = Field(10_000_000, description="Longest document accepted (characters)")
    max_duplicate_fraction: Fraction = Field(
        0.05, description="Largest fraction of a split's documents that exactly repeat an earlier one")
    max_overlap_fraction: Fraction = Field(
        0.05, description="Largest fraction of val documents allowed to near-duplicate a train document")
    overlap_jaccard: Fraction = Field(0.8, description="Jaccard similarity that counts as overlap")
    num_perm: PositiveInt = Field(128, description="MinHash permutations")
    shingle_words: PositiveInt = Field(5, description="Word n-gram size of MinHash shingles")
    action: Literal["fail", "decontaminate"] = Field(
        "fail", description="On overlap above the limit: fail the run, or drop contaminated val documents and go on")
    workers: int | None = Field(None, gt=0, description="Processes/threads for hashing and MinHash; None = all cores")


class TokenizerConfig(Section):
    """Byte-level BPE, trained on the train split unless ``path`` names one to load."""

    vocab_size: Annotated[int, Field(ge=260, le=1_048_576)] = 8192
    min_frequency: PositiveInt = 2
    eos_token: str = "<|endoftext|>"
    path: str | None = Field(None, description="Load this tokenizer.json instead of training one")


class PackConfig(Section):
    """Fixed-length windows of ``seq_len + 1`` tokens; documents joined by EOS."""

    seq_len: PositiveInt = 256
    shard_tokens: PositiveInt = Field(16_777_216, description="Tokens per numpy shard")
    dtype: Literal["auto", "uint16", "uint32"] = Field(
        "auto", description="Token dtype of the shards; auto = uint16 when the vocabulary fits")


class ModelConfig(Section):
    """A GPT; the vocabulary size comes from the tokenizer."""

    n_layer: PositiveInt = 12
    n_head: PositiveInt = 12
    n_embd: PositiveInt = 768
    block_size: PositiveInt = Field(1024, description="Longest context the model supports")
    dropout: Fraction = 0.0

    @model_validator(mode="after")
    def _heads_divide_width(self) -> ModelConfig:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be a multiple of n_head ({self.n_head})")
        return self


class TrainConfig(Section):
    steps: PositiveInt = 10_000
    batch_size: PositiveInt = Field(16, description="Sequences per process per micro-step")
    grad_accum: PositiveInt = 1
    lr: float = Field(3e-4, gt=0.0, description="Peak learning rate")
    min_lr: float = Field(3e-5, ge=0.0)
    warmup_steps: Annotated[int, Field(ge=0)] = 100
    weight_decay: float = Field(0.1, ge=0.0)
    grad_clip: float = Field(1.0, ge=0.0, description="0 disables clipping")
    decay: Literal["cosine", "linear"] = Field("cosine", description="LR decay after warmup, down to min_lr")
    seed: int = 1337
    log_every: PositiveInt = 10
    deterministic: bool = False
    parallel: Literal["ddp", "fsdp"] = Field(
        "ddp", description="ddp replicates the model per process; fsdp (FSDP2 fully_shard) shards it")
    precision: Literal["auto", "fp32", "bf16"] = Field("auto", description="auto = bf16 autocast on GPU, fp32 on CPU")
    peak_tflops: float | None = Field(
        None, gt=0.0, description="Peak TFLOP/s per device for the MFU metric; None = from the GPU's data sheet")
    max_nonfinite_steps: PositiveInt = Field(
        5, description="NaN/Inf loss or gradient skips the step; this many in a row stops the run")
    spike_window: PositiveInt = Field(100, description="Steps of loss history for spike detection")
    spike_sigma: float = Field(6.0, gt=0.0, description="A loss above mean + this many std devs is logged as a spike")
    data_timeout_s: PositiveInt = Field(
        300, description="No batch for this long: dump all thread stacks and fail (data-loader watchdog)")


class CheckpointConfig(Section):
    every_steps: PositiveInt = 500
    keep_last_n: PositiveInt = 3
    async_save: bool = Field(True, description="Write checkpoints in the background while training goes on")


# --- compute.kubernetes: the pod spec of each training node (rendered by pipelines/launch/k8s.py) ---

_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_QUANTITY = r"^(\d+(\.\d+)?|\.\d+)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"
_ENV_NAME = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
_SECRETISH = re.compile(r"secret|passw|token|credential|private.?key|access.?key|api.?key|auth", re.I)
_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
DnsLabel = Annotated[str, Field(pattern=_DNS_LABEL)]
Quantity = Annotated[str, Field(pattern=_QUANTITY)]


def check_label(key: str, value: str) -> str | None:
    """Why a Kubernetes label is invalid (None when valid): ``[prefix/]name`` ≤ 63, value ≤ 63."""
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not re.match(_DNS_SUBDOMAIN, prefix)):
        return f"label key prefix {prefix!r} is not a DNS subdomain"
    if not name or not _LABEL_VALUE.match(name):
        return f"label key name {name!r} must be 1-63 chars of [A-Za-z0-9._-], alphanumeric at both ends"
    if not _LABEL_VALUE.match(value):
        return f"label value {value!r} must be at most 63 chars of [A-Za-z0-9._-], alphanumeric at both ends"
    return None


class Toleration(Section):
    key: str | None = None
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = Field(None, ge=0, description="NoExecute only: how long the pod stays bound")


class SecretEnv(Section):
    """One environment variable read from a Secret key: the spec names the Secret, never holds the value."""

    name: str = Field(pattern=_ENV_NAME)
    secret: DnsLabel = Field(description="Secret name in the job's namespace")
    key: str = Field(min_length=1, description="Key inside the Secret")


class KubernetesConfig(Section):
    """Pod spec of each training node on Kubernetes (``compute.launcher: kubernetes``).

    Secrets are only ever referenced by name (``secret_env``, ``secret_env_from``); the rendered
    objects carry no credential values, so they can be printed, logged and reviewed.
    """

    connection_id: str = Field("kubernetes_default", min_length=1,
                               description="Airflow connection holding the cluster credentials")
    namespace: DnsLabel = "taxiway"
    service_account: str = Field("taxiway-trainer", pattern=_DNS_SUBDOMAIN, max_length=253,
                                 description="Service account of the node pods (needs no API permissions)")
    require_digest: bool = Field(False, description="Refuse tag-pinned images too: only repo@sha256:<digest>")
    image: str | None = Field(
        None, description="Trainer image (docker/trainer.Dockerfile), pinned: repo@sha256:<digest> (preferred) "
                          "or repo:<git-sha tag>; ':latest' and untagged images are refused")
    image_pull_secrets: list[DnsLabel] = Field([], description="Secret names for pulling from a private registry")
    cpu: Quantity = Field("8", description="CPU request per node pod")
    cpu_limit: Quantity | None = Field(
        None, description="CPU limit per node pod; None = no CFS quota (throttling slows data loading and NCCL)")
    memory: Quantity = Field("64Gi", description="Memory request and limit per node pod")
    gpus: Annotated[int, Field(ge=0)] = Field(0, description="nvidia.com/gpu per node pod (request = limit)")
    shm_size: Quantity = Field("16Gi", description="Size of /dev/shm (memory-medium emptyDir; counts as memory)")
    node_selector: dict[str, str] = {}
    tolerations: list[Toleration] = []
    affinity: dict[str, Any] | None = Field(
        None, description="Pod affinity as in Kubernetes: nodeAffinity, podAffinity, podAntiAffinity")
    priority_class: str | None = Field(None, pattern=_DNS_SUBDOMAIN, max_length=253)
    volume_claim: DnsLabel | None = Field(
        None, description="PersistentVolumeClaim (ReadWriteMany) holding TAXIWAY_HOME: run folders, checkpoints, "
                          "packed data; Airflow workers mount the same volume at mount_path")
    mount_path: str = Field("/taxiway", pattern=r"^/[^:]*$",
                            description="Where the volume is mounted in the pods: TAXIWAY_HOME there")
    secret_env: list[SecretEnv] = Field([], description="Env vars from Secret keys (e.g. object-store credentials)")
    secret_env_from: list[DnsLabel] = Field([], description="Secrets whose every key becomes an env var")
    env: dict[str, str] = Field({}, description="Plain env vars (e.g. NCCL_SOCKET_IFNAME); never secrets")
    labels: dict[str, str] = Field({}, description="Extra labels on the Job, its pods and the Service")
    run_as_user: Annotated[int, Field(ge=1)] = Field(10001, description="Non-root uid (the trainer image's)")
    run_as_group: Annotated[int, Field(ge=1)] = 10001
    fs_group: Annotated[int, Field(ge=1)] = Field(10001, description="Group owning the mounted volume's files")
    termination_grace_s: PositiveInt = Field(
        300, description="SIGTERM → SIGKILL window of a node pod; must exceed checkpoint_save_s")
    checkpoint_save_s: PositiveInt = Field(
        60, description="Longest checkpoint save on this cluster; a SIGTERMed node saves one before exiting")
    rendezvous_port: Annotated[int, Field(ge=1024, le=65535)] = Field(29400, description="torchrun c10d port")
    rendezvous_timeout_s: PositiveInt = Field(
        900, description="How long nodes wait for the whole gang to join (pods may start minutes apart)")
    ttl_after_finished_s: Annotated[int, Field(ge=0)] = Field(
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
    """Why an image reference is not pinned (None when it is): digest preferred, a tag at least."""
    if _DIGEST.search(image):
        return None
    if require_digest:
        return f"{image!r} is not pinned by digest (require_digest is set): use repo@sha256:<digest>"
    name, sep, tag = image.rpartition(":")
    if not sep or "/" in tag:
        return f"{image!r} has no tag, so it means ':latest'; pin it: repo@sha256:<digest> or repo:<git-sha>"
    if tag.lower() == "latest":
        return f"{image!r} uses ':latest', which moves; pin it: repo@sha256:<digest> or repo:<git-sha>"
    if not _TAG.match(tag) or not name or name != name.lower():
        return f"{image!r} is not a valid image reference (lowercase repository, tag of [A-Za-z0-9_.-])"
    return None


class ComputeConfig(Section):
    launcher: Literal["local", "kubernetes"] = "local"
    nodes: PositiveInt = 2
    procs_per_node: PositiveInt = 1
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    threads_per_proc: PositiveInt = Field(1, description="torch intra-op threads per process")
    timeout_s: PositiveInt = Field(86_400, description="Wall-clock limit for the training gang")
    stall_timeout_s: PositiveInt = Field(
        600, description="No heartbeat and no step progress for this long = stalled: kill and relaunch from the "
                         "newest valid checkpoint")
    startup_timeout_s: PositiveInt = Field(
        1800, description="Longest a (re)launched gang may take to show its first progress (scheduling, "
                          "rendezvous, loading the checkpoint) before it counts as stalled")
    cancel_grace_s: PositiveInt = Field(
        120, description="After SIGTERM, how long nodes get to save a checkpoint before SIGKILL")
    report_every_s: PositiveInt = Field(
        30, description="How often the waiting training sensor logs progress and ships new metrics to MLflow")
    unwatched_timeout_s: Annotated[int, Field(ge=30)] = Field(
        600, description="Local gangs: nobody watched the gang for this long (the Airflow task and its trigger "
                         "both gone) = checkpoint and stop instead of training on unwatched")
    kubernetes: KubernetesConfig = Field(KubernetesConfig(), description="Node pods when launcher is kubernetes")

    @model_validator(mode="after")
    def _kubernetes_complete(self) -> ComputeConfig:
        k = self.kubernetes
        if k.gpus and self.procs_per_node != k.gpus:
            raise ValueError(f"procs_per_node ({self.procs_per_node}) must equal kubernetes.gpus ({k.gpus}): "
                             "one trainer process per GPU")
        if self.launcher == "kubernetes" and (missing := [f"kubernetes.{f}" for f in ("image", "volume_claim")
                                                          if getattr(k, f) is None]):
            raise ValueError(f"{' and '.join(missing)} required when launcher is 'kubernetes'")
        if self.launcher == "kubernetes" and not k.checkpoint_save_s < self.cancel_grace_s <= k.termination_grace_s:
            raise ValueError(
                f"need kubernetes.checkpoint_save_s ({k.checkpoint_save_s}) < cancel_grace_s ({self.cancel_grace_s}) "
                f"<= kubernetes.termination_grace_s ({k.termination_grace_s}): after SIGTERM the trainer saves "
                "within cancel_grace_s, and the pod is killed after termination_grace_s")
        return self


class EvalConfig(Section):
    """The evaluation gate: paired bootstrap of the bits-per-byte improvement over the baseline."""

    batch_size: PositiveInt = 16
    max_batches: int | None = Field(None, gt=0, description="Cap on validation batches; None = all")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto = cuda when a GPU is visible")
    baseline: str = Field(
        "champion", pattern=r"^(champion|parent|floor|models:/.+)$",
        description="'champion' (registry alias; the floor while none is registered), 'parent', 'floor', "
                    "or a models:/NAME/VERSION or models:/NAME@ALIAS URI")
    floor: Literal["unigram", "uniform"] = Field(
        "unigram", description="What a model must beat with no baseline: the validation set's unigram entropy, "
                               "or a uniform guess over the vocabulary")
    min_improvement: float = Field(
        0.0, ge=0.0, description="Bits per byte the candidate must gain (at the lower confidence bound) to pass")
    confidence: float = Field(0.95, ge=0.5, lt=1.0, description="One-sided confidence of the gate's lower bound")
    bootstrap_samples: int = Field(2000, ge=100, le=100_000, description="Paired bootstrap resamples")
    seed: int = Field(0, description="Seed of the bootstrap and of the sampled generations")
    prompts: list[Annotated[str, Field(min_length=1)]] = Field(
        ["The ", "In the "], max_length=16, description="Fixed prompts whose generations the report shows")
    generate_tokens: Annotated[int, Field(ge=1, le=4096)] = Field(48, description="New tokens per generation")
    temperature: float = Field(0.8, ge=0.0, description="Sampling temperature; 0 = greedy")
    top_k: int | None = Field(40, gt=0, description="Sample from the k most likely tokens; None = all")


class RegistryConfig(Section):
    """MLflow registration: names, aliases, and how hard to try when the server is away."""

    model_name: str = Field("taxiway-gpt", min_length=1)
    champion_alias: str = "champion"
    challenger_alias: str = "challenger"
    retries: Annotated[int, Field(ge=0, le=20)] = Field(
        5, description="Retries of a transient MLflow failure (connection refused, database locked, 5xx)")
    retry_backoff_s: float = Field(2.0, ge=0.0, description="First retry delay; doubles each retry, capped at 60 s")
    lock_timeout_s: float = Field(
        300.0, gt=0.0, description="Longest wait for the champion lock; then registration fails (and may be retried)")
    max_reevaluations: Annotated[int, Field(ge=0, le=10)] = Field(
        3, description="Re-evaluations against a champion that moved while this run was being evaluated")


class RunConfig(Section):
    name: str = Field("taxiway", min_length=1, pattern=r"^[A-Za-z0-9._-]+$",
                      description="Experiment name (MLflow experiment)")
    data: DataConfig
    preflight: PreflightConfig = PreflightConfig()
    tokenizer: TokenizerConfig = TokenizerConfig()
    pack: PackConfig = PackConfig()
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    compute: ComputeConfig = ComputeConfig()
    eval: EvalConfig = EvalConfig()
    registry: RegistryConfig = RegistryConfig()
    parent: str | None = Field(None, description="models:/ URI to continue training from")

    @model_validator(mode="after")
    def _context_fits(self) -> RunConfig:
        if self.pack.seq_len > self.model.block_size:
            raise ValueError(
                f"pack.seq_len ({self.pack.seq_len}) exceeds model.block_size ({self.model.block_size})")
        return self

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)

    def sha256(self) -> str:
        """Hash of the canonical YAML, the identity recorded in checkpoints and lineage."""
        return hashlib.sha256(self.to_yaml().encode()).hexdigest()


# --- loading -------------------------------------------------------------------------------

_VAR = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}")


def _expand(value: Any, where: str, errors: dict[str, str]) -> Any:
    """Expand ``${VAR}`` / ``${VAR:-default}``; TAXIWAY_HOME always resolves."""
    if isinstance(value, dict):
        return {k: _expand(v, f"{where}.{k}" if where else k, errors) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, f"{where}[{i}]", errors) for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(2)
        if name == "TAXIWAY_HOME":
            return str(taxiway_home())
        if name in os.environ:
            return os.environ[name]
        if default is not None:
            return default
        errors[where] = f"environment variable {name} is not set"
        return m.group(0)

    return _VAR.sub(sub, value)


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Overlay ``over`` onto ``base``: dicts merge key by key, anything else replaces."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def suggest(name: str, known: list[str] | tuple[str, ...]) -> str:
    """`` (did you mean 'x'?)`` for a near-miss of one of ``known`` (a typo), else ''."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _check_sections(raw: dict[str, Any], source: str, from_file: bool = True) -> None:
    """Refuse top-level keys that are no config section, with a did-you-mean.

    In a file, only near-misses (typos) are named: any other unknown key means the file is not a
    RunConfig at all, and nothing of it is shown, since an error message must not echo a file
    someone pointed the config at (a kubeconfig, a Secret). Keys a user typed are always named.
    """
    unknown = [k for k in raw if k not in SECTIONS and k != "extends"]
    typos = {k: suggest(str(k), list(SECTIONS)) for k in unknown}
    foreign = [k for k, hint in typos.items() if not hint]
    if from_file and (foreign or (unknown and len(unknown) == len(raw))):
        raise ConfigError({"<file>": f"not a RunConfig: {len(foreign) or len(unknown)} top-level key(s) are no "
                                     f"config section (not shown); sections: {', '.join(SECTIONS)}"}, source)
    if unknown:
        raise ConfigError({str(k): f"not a config section{typos[k]}" for k in unknown}, source)


def read_yaml_chain(path: str | Path, roots: Roots | None = None, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Read a YAML config and the files it ``extends:`` (relative to itself), base first.

    With ``roots`` (runs started from a trigger), every file of the chain must lie inside a config root.
    """
    path = Path(path).resolve()
    if roots is not None and not roots.inside_configs(path):
        raise ConfigError({"<file>": f"outside the config roots ({roots.describe_configs()})"}, str(path))
    if path in _seen:
        raise ConfigError({"extends": f"cycle through {path}"}, str(path))
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise ConfigError({"<file>": "does not exist"}, str(path)) from None
    except (UnicodeDecodeError, IsADirectoryError):
        raise ConfigError({"<file>": "not a text file"}, str(path)) from None
    except yaml.YAMLError as exc:  # where, never what: the snippet would echo the file
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError({"<file>": f"not valid YAML{where}"}, str(path)) from None
    if not isinstance(raw, dict):
        raise ConfigError({"<file>": "not a RunConfig: its top level is not a mapping"}, str(path))
    _check_sections(raw, str(path))
    parents = raw.pop("extends", None) or []
    merged: dict[str, Any] = {}
    for parent in [parents] if isinstance(parents, str) else parents:
        merged = deep_merge(merged, read_yaml_chain(path.parent / parent, roots, _seen + (path,)))
    return deep_merge(merged, raw)


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key.path=value`` strings; values parse as YAML scalars (``3e-4``, ``true``, ``[1,2]``)."""
    out = copy.deepcopy(raw)
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError({item: "expected key.path=value"}, "--set")
        value = yaml.safe_load(text) if text.strip() else None
        if isinstance(value, str) and re.fullmatch(r"[-+]?\d*\.?\d+[eE][-+]?\d+", value):
            value = float(value)  # YAML 1.1 reads 3e-4 as a string
        node = out
        *parents, leaf = key.strip().split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError({key: f"{part} is not a section"}, "--set")
        node[leaf] = value
    return out


def _field_names(loc: tuple[Any, ...]) -> list[str]:
    """The fields a model at ``loc`` (the parent of an unknown field) accepts."""
    model: Any = RunConfig
    for part in loc:
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return []
        model = field.annotation
    return list(getattr(model, "model_fields", {}))


def _reason(err: dict[str, Any]) -> str:
    """One line per error: the rule, never the offending value."""
    if err["type"] == "extra_forbidden":
        return "unknown field" + suggest(str(err["loc"][-1]), _field_names(err["loc"][:-1]))
    return err["msg"]


def validate(raw: dict[str, Any], source: str = "config") -> RunConfig:
    errors: dict[str, str] = {}
    _check_sections(raw, source, from_file=False)  # files were checked as read: this catches overrides
    expanded = _expand(raw, "", errors)
    if errors:
        raise ConfigError(errors, source)
    try:
        return RunConfig.model_validate(expanded)
    except ValidationError as exc:
        for err in exc.errors():
            path = ".".join(str(p) for p in err["loc"]) or "<root>"
            errors[path] = _reason(err)
        raise ConfigError(errors, source) from None


def load_config(path: str | Path, overrides: list[str] | None = None,
                extra: dict[str, Any] | None = None, roots: Roots | None = None) -> RunConfig:
    """File (with extends) → ``extra`` overlay (e.g. a DAG run's conf) → ``--set`` overrides.

    ``roots`` confines the file chain to the config roots (runs started from a trigger)."""
    raw = read_yaml_chain(path, roots)
    if extra:
        raw = deep_merge(raw, extra)
    return validate(apply_overrides(raw, overrides or []), str(path))


# --- JSON schema for forms -----------------------------------------------------------------

def _inline_refs(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        if "$ref" in node:
            target = defs[node["$ref"].rsplit("/", 1)[-1]]
            return _inline_refs({**target, **{k: v for k, v in node.items() if k != "$ref"}}, defs)
        return {k: _inline_refs(v, defs) for k, v in node.items() if k != "$defs"}
    if isinstance(node, list):
        return [_inline_refs(v, defs) for v in node]
    return node


def section_schemas() -> dict[str, dict[str, Any]]:
    """Self-contained JSON schema per RunConfig section (no ``$ref``, nothing required).

    Params built from these validate a partial override at trigger time; the full RunConfig
    validation (required data paths, cross-field rules) runs in the first task.
    """
    schema = RunConfig.model_json_schema()
    defs = schema.get("$defs", {})
    out = {}
    for name, prop in schema["properties"].items():
        inlined = _inline_refs(prop, defs)
        inlined.pop("required", None)
        inlined.pop("default", None)
        out[name] = inlined
    return out
