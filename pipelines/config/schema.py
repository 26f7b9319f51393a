"""RunConfig: the one validated, frozen description of a training run, section by section.

Everything that changes between experiments lives here; orchestration and execution only read it.
"""

from __future__ import annotations

import hashlib
from typing import Annotated, Literal

import yaml
from croniter import croniter
from pydantic import Field, field_validator, model_validator

from pipelines.config import limits
from pipelines.config.alerts import AlertsConfig
from pipelines.config.base import Bounded, Fraction, PathText, Section
from pipelines.config.kubernetes import KubernetesConfig
from pipelines.config.limits import LimitsConfig

_ALIAS = r"^[A-Za-z][A-Za-z0-9_-]{0,63}$"  # an MLflow alias (not v<digits>, which names a version)
MAX_METRIC_LINES = 1_000_000   # of one run's metrics.jsonl
MAX_CHECKPOINTS = 100_000      # written by one run (keep_last_n of them kept)


class DataConfig(Section):
    """Where the raw text lives. Paths are local paths or fsspec URIs."""

    train: PathText = Field(description="Folder or glob of training documents")
    val: PathText = Field(description="Folder or glob of validation documents")
    manifest: PathText = Field(description="JSON Lines manifest: path, split, bytes, sha256 per file")
    format: Literal["txt", "jsonl", "parquet"] | None = Field(
        default=None, description="Input format; inferred from file extensions when unset")


class PreflightConfig(Section):
    """Gate thresholds checked before any compute is spent."""

    allow_unlisted: bool = Field(False, description="Accept data files missing from the manifest")
    min_chars: Annotated[int, Field(ge=0, le=1_000_000)] = Field(1, description="Shortest document accepted (characters)")
    max_chars: Bounded(1_000_000_000) = Field(10_000_000, description="Longest document accepted (characters)")
    max_duplicate_fraction: Fraction = Field(
        0.05, description="Largest fraction of a split's documents that exactly repeat an earlier one")
    max_overlap_fraction: Fraction = Field(
        0.05, description="Largest fraction of val documents allowed to near-duplicate a train document")
    overlap_jaccard: Fraction = Field(0.8, description="Jaccard similarity that counts as overlap")
    num_perm: Bounded(1024) = Field(128, description="MinHash permutations")
    shingle_words: Bounded(64) = Field(5, description="Word n-gram size of MinHash shingles")
    action: Literal["fail", "decontaminate"] = Field(
        "fail", description="On overlap above the limit: fail the run, or drop contaminated val documents and go on")
    workers: Bounded(1024) | None = Field(
        None, description="Processes for preflight's shard scans (CLI) and its reduce's checks; None = all cores")
    shard_bytes: Bounded(1 << 34) = Field(
        16 << 20, description="Target bytes of data files per preflight shard (one mapped Airflow task each; "
        "content-defined boundaries, 0.5x to 2x the target; a shard never spans both splits)")


class TokenizerConfig(Section):
    """Byte-level BPE, trained on the train split unless 'path' names a tokenizer.json to load."""

    vocab_size: Annotated[int, Field(ge=260, le=1_048_576)] = Field(
        8192, description="Tokens in the vocabulary, the 256 byte tokens and the end-of-text token included")
    min_frequency: Bounded(1_000_000) = Field(2, description="Fewest occurrences for a pair to be merged")
    eos_token: str = Field("<|endoftext|>", min_length=1, max_length=64, description="The token that joins documents")
    path: PathText | None = Field(None, description="Load this tokenizer.json instead of training one")
    train_max_bytes: Bounded(1 << 40) | None = Field(
        67_108_864, description="Train the BPE on at most this many bytes of the train split: whole files, taken in "
        "order of their sha256 (a sample that does not depend on names or on which files were added last), so the "
        "tokenizer's time and memory stay bounded however large the corpus grows; null = every train file")


class PackConfig(Section):
    """Fixed-length windows of seq_len + 1 tokens; documents joined by the end-of-text token."""

    seq_len: Bounded(131_072) = Field(256, description="Tokens per training sequence; at most model.block_size")
    shard_tokens: Bounded(1 << 31) = Field(16_777_216, description="Tokens per numpy shard")
    shard_bytes: Bounded(1 << 34) = Field(
        16_777_216, description="Input bytes per mapped tokenize task (whole file groups; at least one group "
                                "each; a remainder under half of it joins the last task). Spreads the encoding "
                                "over workers; the packed dataset is the same")
    dtype: Literal["auto", "uint16", "uint32"] = Field(
        "auto", description="Token dtype of the shards; auto = uint16 when the vocabulary fits")


class ModelConfig(Section):
    """The model to train; the vocabulary size comes from the tokenizer. The llama architecture (the default)
    names its tensors as the transformers library's LlamaForCausalLM, so a registered version loads and serves
    as a Hugging Face model; gpt is Taxiway's first model, kept so its versions train on. A run that continues
    a parent, or starts from a pretrained folder, trains that model, whatever this section says."""

    arch: Literal["llama", "gpt"] = Field("llama", description="llama (RMSNorm, rotary, SwiGLU, grouped-query "
                                          "attention) or gpt (LayerNorm, learned positions, GELU)")
    n_layer: Bounded(512) = Field(12, description="Transformer blocks")
    n_head: Bounded(512) = Field(12, description="Attention heads per block; must divide the width")
    n_embd: Bounded(65_536) = Field(768, description="Width: embedding and hidden size")
    block_size: Bounded(131_072) = Field(1024, description="Longest context the model supports")
    dropout: Fraction = Field(0.0, description="Dropout probability while training")
    n_kv_head: Bounded(512) | None = Field(None, description="llama: key/value heads (grouped-query attention); "
                                           "must divide n_head; unset = n_head")
    intermediate_size: Bounded(1_048_576) | None = Field(
        None, description="llama: SwiGLU hidden width; unset = 8/3 of n_embd, rounded up to a multiple of 32")
    rope_theta: float = Field(10_000.0, gt=0.0, le=1e9, description="llama: rotary base")
    rms_norm_eps: float = Field(1e-5, gt=0.0, le=0.1, description="llama: RMSNorm epsilon")
    tie_embeddings: bool = Field(True, description="llama: the output head is the token embedding (gpt always ties)")

    @model_validator(mode="after")
    def _heads_divide_width(self) -> ModelConfig:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be a multiple of n_head ({self.n_head})")
        if self.arch == "gpt":
            if own := [k for k in _LLAMA_ONLY if getattr(self, k) != ModelConfig.model_fields[k].default]:
                raise ValueError(f"{', '.join(own)}: llama settings; arch is gpt")
        elif self.n_head % self.kv_heads:
            raise ValueError(f"n_head ({self.n_head}) must be a multiple of n_kv_head ({self.kv_heads})")
        elif (self.n_embd // self.n_head) % 2:
            raise ValueError(f"head size n_embd / n_head ({self.n_embd // self.n_head}) must be even (rotary positions)")
        return self

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    @property
    def hidden(self) -> int:
        """The SwiGLU width: ``intermediate_size``, else Llama's 8/3 of the width rounded up to 32."""
        return self.intermediate_size or -(-8 * self.n_embd // 3 // 32) * 32

    def trainer_fields(self, vocab_size: int) -> dict[str, object]:
        """The model as the trainer builds it (``trainer.arch.config_from_dict``)."""
        common = {"arch": self.arch, "vocab_size": vocab_size, "n_layer": self.n_layer, "n_head": self.n_head,
                  "n_embd": self.n_embd, "block_size": self.block_size, "dropout": self.dropout}
        if self.arch == "gpt":
            return common
        return {**common, "n_kv_head": self.kv_heads, "intermediate_size": self.hidden, "rope_theta": self.rope_theta,
                "rms_norm_eps": self.rms_norm_eps, "tie_embeddings": self.tie_embeddings}


_LLAMA_ONLY = ("n_kv_head", "intermediate_size", "rope_theta", "rms_norm_eps", "tie_embeddings")


class TrainConfig(Section):
    """The optimizer and its schedule: AdamW, linear warmup, then decay to min_lr."""

    steps: Bounded(10_000_000) = Field(10_000, description="Optimizer steps to train (at most limits.steps)")
    batch_size: Bounded(65_536) = Field(16, description="Sequences per process per micro-step")
    grad_accum: Bounded(4096) = Field(1, description="Micro-steps per optimizer step (gradient accumulation)")
    # a rate: its ceiling keeps it within 64 bits; a diverging one is the smoke test's to catch (test_live_sweep)
    lr: float = Field(3e-4, gt=0.0, le=1e18, description="Peak learning rate")
    min_lr: float = Field(3e-5, ge=0.0, le=10.0, description="Learning rate at the end of the decay")
    warmup_steps: Annotated[int, Field(ge=0, le=10_000_000)] = Field(100, description="Steps of linear warmup from 0 to lr")
    rewarmup_steps: Annotated[int, Field(ge=0, le=10_000_000)] = Field(
        0, description="With a parent: steps from its final LR back up to lr before decaying; 0 = decay on from it")
    weight_decay: float = Field(0.1, ge=0.0, le=10.0, description="AdamW weight decay (not applied to biases and norms)")
    grad_clip: float = Field(1.0, ge=0.0, le=1e6, description="0 disables clipping")
    decay: Literal["cosine", "linear"] = Field("cosine", description="LR decay after warmup, down to min_lr")
    seed: Annotated[int, Field(ge=0, le=2**63 - 1)] = Field(1337, description="Seed of initialization, data order and dropout")
    log_every: Bounded(1_000_000) = Field(10, description="Steps between lines of metrics.jsonl")
    deterministic: bool = Field(False, description="Deterministic kernels: reproducible, slower")
    parallel: Literal["ddp", "fsdp"] = Field(
        "ddp", description="ddp replicates the model per process; fsdp (FSDP2 fully_shard) shards it")
    precision: Literal["auto", "fp32", "bf16"] = Field("auto", description="auto = bf16 autocast on GPU, fp32 on CPU")
    peak_tflops: float | None = Field(
        None, gt=0.0, le=1e6, description="Peak TFLOP/s per device for the MFU metric; None = from the GPU's data sheet")
    max_nonfinite_steps: Bounded(10_000) = Field(
        5, description="NaN/Inf loss or gradient skips the step; this many in a row stops the run")
    spike_window: Bounded(1_000_000) = Field(100, description="Steps of loss history for spike detection")
    spike_sigma: float = Field(6.0, gt=0.0, le=1000.0, description="A loss above mean + this many std devs is logged as a spike")
    data_timeout_s: Bounded(86_400) = Field(
        300, description="No batch for this long: dump all thread stacks and fail (data-loader watchdog)")


class CheckpointConfig(Section):
    """Checkpoints under the run folder, from which a restarted gang resumes."""

    every_steps: Bounded(10_000_000) = Field(500, description="Steps between checkpoints (the last step always gets one)")
    keep_last_n: Bounded(100) = Field(3, description="Newest valid checkpoints kept; older ones are deleted")
    async_save: bool = Field(True, description="Write checkpoints in the background while training goes on")


class ComputeConfig(Section):
    """The training gang: how many nodes and processes, where they run, and how long they may take."""

    launcher: Literal["local", "kubernetes"] = Field(
        "local", description="local = node processes on the Airflow worker; kubernetes = one pod per node")
    nodes: Bounded(1024) = Field(2, description="Nodes of the gang (torchrun --nnodes; at most limits.nodes)")
    procs_per_node: Bounded(64) = Field(
        1, description="Trainer processes per node (one per GPU; at most limits.procs_per_node)")
    backend: Literal["auto", "gloo", "nccl"] = Field(
        "auto", description="torch.distributed backend; auto = nccl on GPUs, gloo on CPU")
    threads_per_proc: Bounded(1024) = Field(1, description="torch intra-op threads per process")
    timeout_s: Bounded(90 * 86_400) = Field(86_400, description="Wall-clock limit for the training gang")
    stall_timeout_s: Bounded(86_400) = Field(
        600, description="No heartbeat and no step progress for this long = stalled: kill and relaunch from the "
                         "newest valid checkpoint")
    startup_timeout_s: Bounded(86_400) = Field(
        1800, description="Longest a (re)launched gang may take to show its first progress (scheduling, "
                          "rendezvous, loading the checkpoint) before it counts as stalled")
    cancel_grace_s: Bounded(3600) = Field(
        120, description="After SIGTERM, how long nodes get to save a checkpoint before SIGKILL")
    report_every_s: Bounded(3600) = Field(
        30, description="How often the waiting training sensor logs progress and ships new metrics to MLflow")
    unwatched_timeout_s: Annotated[int, Field(ge=30, le=86_400)] = Field(
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

    batch_size: Bounded(65_536) = Field(16, description="Validation sequences per batch")
    max_batches: Bounded(10_000_000) | None = Field(None, description="Cap on validation batches; None = all")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto = cuda when a GPU is visible")
    baseline: str = Field(
        "champion", pattern=r"^(champion|parent|floor|models:/.+)$", max_length=512,
        description="'champion' (registry alias; the floor while none is registered), 'parent', 'floor', "
                    "or a models:/NAME/VERSION or models:/NAME@ALIAS URI")
    floor: Literal["unigram", "uniform"] = Field(
        "unigram", description="What a model must beat with no baseline: the validation set's unigram entropy, "
                               "or a uniform guess over the vocabulary")
    min_improvement: float = Field(
        0.0, ge=0.0, le=100.0, description="Bits per byte the candidate must gain (at the lower confidence bound) to pass")
    confidence: float = Field(0.95, ge=0.5, lt=1.0, description="One-sided confidence of the gate's lower bound")
    bootstrap_samples: int = Field(2000, ge=100, le=100_000, description="Paired bootstrap resamples")
    seed: Annotated[int, Field(ge=0, le=2**63 - 1)] = Field(0, description="Seed of the bootstrap and of the sampled generations")
    prompts: list[Annotated[str, Field(min_length=1, max_length=1024)]] = Field(
        ["The ", "In the "], max_length=16, description="Fixed prompts whose generations the report shows")
    generate_tokens: Annotated[int, Field(ge=1, le=4096)] = Field(48, description="New tokens per generation")
    temperature: float = Field(0.8, ge=0.0, le=100.0, description="Sampling temperature; 0 = greedy")
    top_k: Bounded(1 << 21) | None = Field(40, description="Sample from the k most likely tokens; None = all")
    report_sets: list[PathText] = Field(
        [], max_length=8, description="Folders or globs of validation text of the run's own (inside the data roots), "
                                      "scored for candidate and baseline and reported beside the gate's set "
                                      "(data.val), never deciding a promotion")


class RegistryConfig(Section):
    """MLflow registration: names, aliases, and how hard to try when the server is away."""

    model_name: str = Field("taxiway-gpt", min_length=1, max_length=256, description="Registered model the version is added to")
    champion_alias: str = Field("champion", pattern=_ALIAS, max_length=64, description="Alias of the model to beat; moves only on a passed gate")
    challenger_alias: str = Field("challenger", pattern=_ALIAS, max_length=64, description="Alias of the newest version that did not pass")
    retries: Annotated[int, Field(ge=0, le=20)] = Field(
        5, description="Retries of a transient MLflow failure (connection refused, database locked, 5xx)")
    retry_backoff_s: float = Field(2.0, ge=0.0, le=60.0, description="First retry delay; doubles each retry, capped at 60 s")
    lock_timeout_s: float = Field(
        300.0, gt=0.0, le=3600.0, description="Longest wait for the champion lock; then registration fails (and may be retried)")
    max_reevaluations: Annotated[int, Field(ge=0, le=10)] = Field(
        3, description="Re-evaluations against a champion that moved while this run was being evaluated")
    approval: Literal["auto", "required"] = Field(
        "auto", description="auto: a passed gate moves the champion alias; required: a person approves it first "
                            "(an Airflow human-in-the-loop task, UI or REST); reject or timeout leaves it challenger")
    approval_timeout_s: float = Field(
        7 * 86400.0, gt=0.0, le=90 * 86400.0, description="Longest an approval waits; then the version is challenger")
    approval_reminder_s: float = Field(
        86400.0, gt=0.0, le=90 * 86400.0, description="An approval waiting this long raises an alert (alerts.*)")
    approvers: list[Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[^\x00-\x1f]+$")]] = Field(
        [], max_length=64, description="Who may answer an approval (the task's assigned users): user ids, or "
                                       "role:NAME for every user holding that role (SimpleAuthManager); never the "
                                       "user who triggered the run; empty = anyone Airflow lets answer it, less "
                                       "that user")
    log_checkpoint: bool = Field(
        True, description="Log the final full checkpoint (optimizer state too) with the model, so a refresh can "
                          "continue it after the run folder is gone; costs about 3x the weights in artifact storage")

    @model_validator(mode="after")
    def _aliases_differ(self) -> RegistryConfig:
        """One alias for both would let a candidate that failed the gate take the champion's."""
        if self.champion_alias.lower() == self.challenger_alias.lower():
            raise ValueError("champion_alias and challenger_alias must differ: a version that failed the gate "
                             "is given challenger_alias")
        return self


class RefreshConfig(Section):
    """Incremental refresh (the taxiway_refresh DAG): the champion trained further on new batches (docs/refresh.md)."""

    landing: PathText | None = Field(
        None, description="Landing zone of new data batches (local path or fsspec URI); unset = no refresh")
    cron: str = Field("0 3 * * *", min_length=1, max_length=256, description="When the refresh looks for new batches (UTC cron)")

    @field_validator("cron")
    @classmethod
    def _cron_parses(cls, value: str) -> str:
        """A bad cron is refused here, naming the field, not later as a DAG import error."""
        if not croniter.is_valid(value):
            raise ValueError("not a cron expression (five fields, e.g. '0 3 * * *')")
        return value

    steps: Bounded(10_000_000) = Field(200, description="Optimizer steps a refresh trains past the champion's global step")
    warmup_steps: Annotated[int, Field(ge=0, le=10_000_000)] = Field(
        20, description="Re-warmup from the champion's final LR up to refresh.lr (else train.lr), then decay to train.min_lr")
    replay_fraction: Annotated[float, Field(ge=0.0, lt=1.0)] = Field(
        0.25, description="Share of the refresh's train tokens that are replayed old documents (chosen by train.seed)")
    fresh_eval_fraction: Annotated[float, Field(gt=0.0, lt=1.0)] = Field(
        0.1, description="Share of a new batch's train files held out for the new-data gate when it brings no val/")
    max_regression_bpb: float = Field(
        0.02, ge=0.0, le=100.0, description="Largest loss of bits/byte on the fixed validation set a passing refresh may show")
    max_attempts: Bounded(100) = Field(3, description="Failed refreshes a batch may take part in before it is quarantined")
    schedule: Literal["rewarm", "wsd"] = Field(
        "rewarm", description="rewarm: each refresh re-warms the LR from the champion's final LR and decays it again; "
                              "wsd: warmup-stable-decay continued across refreshes (docs/refresh.md)")
    max_age_s: float | None = Field(
        None, gt=0.0, le=365 * 86400.0,
        description="A champion older than this while landed batches wait raises an alert (alerts.*); unset: never")
    decay_steps: Bounded(10_000_000) = Field(
        40, description="wsd: the last steps of each refresh, which decay the LR from refresh.lr (else train.lr) to train.min_lr "
                        "(the released model); the state before them is what the next refresh continues")
    lr: float | None = Field(
        None, gt=0.0, le=10.0, description="Peak (rewarm) or stable (wsd) LR of a refresh; unset: train.lr. "
                                           "Lower forgets less and learns the new data less (docs/refresh.md)")
    forgetting_batches: Annotated[int, Field(ge=0, le=64)] = Field(
        4, description="Earlier batches (newest first) whose held-out slices each refresh scores parent vs "
                       "candidate, to show forgetting; older ones are listed as left out")

    @model_validator(mode="after")
    def _decay_fits(self) -> RefreshConfig:
        if self.schedule == "wsd" and self.warmup_steps + self.decay_steps > self.steps:
            raise ValueError(f"refresh.warmup_steps ({self.warmup_steps}) + refresh.decay_steps ({self.decay_steps}) "
                             f"exceed refresh.steps ({self.steps}): a wsd refresh needs room to warm up and decay")
        return self


class RunConfig(Section):
    name: str = Field("taxiway", min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._-]+$",
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
    refresh: RefreshConfig = RefreshConfig()
    limits: LimitsConfig = LimitsConfig()
    alerts: AlertsConfig = AlertsConfig()
    parent: str | None = Field(None, max_length=512, description="models:/ URI to continue training from")
    pretrained: PathText | None = Field(
        None, description="A Hugging Face model folder to start from (config.json, model.safetensors or a sharded "
                          "index, tokenizer.json; a local path or a data-root URI): its architecture, weights and "
                          "tokenizer replace model.* and tokenizer.*, and it is the model to beat while no champion "
                          "is registered")

    @model_validator(mode="after")
    def _one_start(self) -> RunConfig:
        if self.pretrained and self.parent:
            raise ValueError("pretrained and parent are both set: a run starts from one model (a registered "
                             "version continues as parent)")
        if self.pretrained and self.tokenizer.path:
            raise ValueError("tokenizer.path is set with pretrained: a pretrained model brings its own tokenizer.json")
        return self

    @property
    def lr_schedule(self) -> Literal["rewarm", "wsd"]:
        """The LR schedule's kind: ``refresh.schedule`` shapes every run that continues a parent (a
        refresh above all); a run from scratch keeps ``train``'s warmup and decay (``rewarm``)."""
        return self.refresh.schedule if self.parent else "rewarm"

    @model_validator(mode="after")
    def _context_fits(self) -> RunConfig:
        if self.pack.seq_len > self.model.block_size:
            raise ValueError(
                f"pack.seq_len ({self.pack.seq_len}) exceeds model.block_size ({self.model.block_size})")
        return self

    @model_validator(mode="after")
    def _refresh_lr_above_floor(self) -> RunConfig:
        if self.refresh.lr is not None and self.refresh.lr < self.train.min_lr:
            raise ValueError(f"refresh.lr ({self.refresh.lr}) is below train.min_lr ({self.train.min_lr}), "
                             "where every refresh's LR ends")
        return self

    @model_validator(mode="after")
    def _within_limits(self) -> RunConfig:
        """The deployment's ``limits``, and the counts a run's settings multiply into: lines of
        metrics.jsonl and checkpoints written."""
        problems = limits.problems(self)
        if self.train.steps // self.train.log_every > MAX_METRIC_LINES:
            problems.append(f"train.steps / train.log_every is over {MAX_METRIC_LINES:,} lines of metrics; "
                            "log less often")
        if self.train.steps // self.checkpoint.every_steps > MAX_CHECKPOINTS:
            problems.append(f"train.steps / checkpoint.every_steps is over {MAX_CHECKPOINTS:,} checkpoints; "
                            "checkpoint less often")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)

    def sha256(self) -> str:
        """Hash of the canonical YAML, the identity recorded in checkpoints and lineage."""
        return hashlib.sha256(self.to_yaml().encode()).hexdigest()


SECTIONS: tuple[str, ...] = tuple(RunConfig.model_fields)  # the top-level keys, in order: derived, never listed
