"""RunConfig: the one validated, frozen description of a training run.

Everything that changes between experiments lives here; orchestration and execution only read it.
YAML files compose with ``extends:``, ``${VAR}`` expands from the environment, and dotted
``--set key=value`` overrides apply last. Errors name every bad field by its dotted path.
"""

from __future__ import annotations

import copy
import hashlib
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from pipelines.paths import taxiway_home

SECTIONS = (
    "name", "data", "preflight", "tokenizer", "pack", "model", "train",
    "checkpoint", "compute", "eval", "registry", "parent",
)

PositiveInt = Annotated[int, Field(gt=0)]
Fraction = Annotated[float, Field(ge=0.0, le=1.0)]


class ConfigError(ValueError):
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
    seed: int = 1337
    log_every: PositiveInt = 10
    deterministic: bool = False


class CheckpointConfig(Section):
    every_steps: PositiveInt = 500
    keep_last_n: PositiveInt = 3


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
    cancel_grace_s: PositiveInt = Field(
        120, description="After SIGTERM, how long nodes get to save a checkpoint before SIGKILL")


class EvalConfig(Section):
    batch_size: PositiveInt = 16
    max_batches: int | None = Field(None, gt=0, description="Cap on validation batches; None = all")
    min_improvement: float = Field(
        0.0, description="Bits per byte the candidate must gain over the baseline to become champion")
    baseline: str = Field(
        "champion", description="'champion' (registry alias), 'parent', 'init', or a models:/ URI")


class RegistryConfig(Section):
    model_name: str = Field("taxiway-gpt", min_length=1)
    champion_alias: str = "champion"
    challenger_alias: str = "challenger"


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


def read_yaml_chain(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Read a YAML config and the files it ``extends:`` (relative to itself), base first."""
    path = Path(path).resolve()
    if path in _seen:
        raise ConfigError({"extends": f"cycle through {path}"}, str(path))
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise ConfigError({"<file>": "does not exist"}, str(path)) from None
    except yaml.YAMLError as exc:
        raise ConfigError({"<file>": f"not valid YAML: {exc}"}, str(path)) from None
    if not isinstance(raw, dict):
        raise ConfigError({"<file>": "top level must be a mapping"}, str(path))
    parents = raw.pop("extends", None) or []
    merged: dict[str, Any] = {}
    for parent in [parents] if isinstance(parents, str) else parents:
        merged = deep_merge(merged, read_yaml_chain(path.parent / parent, _seen + (path,)))
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


def validate(raw: dict[str, Any], source: str = "config") -> RunConfig:
    errors: dict[str, str] = {}
    expanded = _expand(raw, "", errors)
    if errors:
        raise ConfigError(errors, source)
    try:
        return RunConfig.model_validate(expanded)
    except ValidationError as exc:
        for err in exc.errors():
            path = ".".join(str(p) for p in err["loc"]) or "<root>"
            errors[path] = err["msg"]
        raise ConfigError(errors, source) from None


def load_config(path: str | Path, overrides: list[str] | None = None,
                extra: dict[str, Any] | None = None) -> RunConfig:
    """File (with extends) → ``extra`` overlay (e.g. a DAG run's conf) → ``--set`` overrides."""
    raw = read_yaml_chain(path)
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
