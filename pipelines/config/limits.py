"""``limits``: the deployment's ceilings on a run's size, which no trigger can raise (``limits`` is
deployment-owned, ``pipelines.config.trust``), and the size estimates they are checked against.

The schema's own bounds keep every value finite; these are the deployment's tighter ones, set in its
config files for what its cluster and disks can take.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from pipelines.config.base import Section

GB = 1 << 30
FP32 = 4
PER_TENSOR_BYTES = 8 << 10  # a weight, its two moments and step count: DCP's record of each (~1.8 KB) and index entry
#                             (~0.3 KB), ~7.9 KB measured
EXTRA_BYTES = 4 << 10       # meta.json, checksums.json
RNG_BYTES = 16 << 10        # each rank's RNG state (~14 KB measured)


class LimitsConfig(Section):
    """Ceilings on what a run may ask for; only the deployment sets them."""

    nodes: Annotated[int, Field(ge=1, le=1024)] = Field(16, description="Most training nodes a run may use")
    procs_per_node: Annotated[int, Field(ge=1, le=64)] = Field(8, description="Most trainer processes per node")
    steps: Annotated[int, Field(ge=1, le=10_000_000)] = Field(
        1_000_000, description="Most optimizer steps a run may train (train.steps)")
    parameters: Annotated[int, Field(ge=1, le=1_000_000_000_000)] = Field(
        2_000_000_000, description="Most model parameters (from model and tokenizer sizes)")
    sweep_members: Annotated[int, Field(ge=2, le=16)] = Field(16, description="Most members of one sweep")
    checkpoint_disk_gb: Annotated[float, Field(gt=0, le=1_000_000)] = Field(
        500.0, description="Most disk a run's checkpoints may take: (checkpoint.keep_last_n + 1) checkpoints, "
                           "the one being written included")
    threads_per_proc: Annotated[int, Field(ge=1, le=1024)] = Field(
        16, description="Most torch threads per trainer process (compute.threads_per_proc)")
    preflight_workers: Annotated[int, Field(ge=1, le=1024)] = Field(
        16, description="Most processes one preflight scan task starts (preflight.workers)")
    tokenizer_train_bytes: Annotated[int, Field(ge=1, le=1 << 40)] = Field(
        4 << 30, description="Most bytes the BPE trains on (tokenizer.train_max_bytes; null = every train file)")
    mapped_tasks: Annotated[int, Field(ge=1, le=4096)] = Field(
        256, description="Most mapped tasks (shards) one stage fans out to, whatever the shard sizes")
    batch_bytes: Annotated[int, Field(ge=1, le=1 << 44)] = Field(
        64 << 30, description="Most bytes of one landed batch (taxiway land)")
    batch_files: Annotated[int, Field(ge=1, le=10_000_000)] = Field(
        100_000, description="Most files of one landed batch (taxiway land)")
    batches: Annotated[int, Field(ge=1, le=1_000_000)] = Field(
        10_000, description="Most batches the landing zone holds; landing one more is refused")
    trigger_may_set: list[Annotated[str, Field(pattern=r"^[a-z_]+(\.[a-z_]+)*$", max_length=128)]] = Field(
        [], max_length=64, description="Deployment-owned fields (dotted paths or sections) this deployment lets "
                                       "a trigger set; empty = none (docs/security.md)")
    trigger_may_choose: list[Annotated[str, Field(pattern=r"^[^\x00]+\.ya?ml$", max_length=256)]] = Field(
        [], max_length=32, description="Config files (relative to this config's folder, or absolute) a trigger "
                                       "may name as its ``config``; whichever it names, every deployment-owned "
                                       "field still comes from this config; empty = none (docs/security.md)")


def parameters(model: Any, vocab_size: int) -> int:
    """Parameters of the model a ``ModelConfig`` builds (trainer/arch.py). ``gpt``: tied token embedding,
    position embedding, per block attention (qkv, proj), a 4x MLP and two LayerNorms, a final LayerNorm.
    ``llama``: token embedding (and an untied head), per layer q/o and the narrower k/v of grouped-query
    attention, SwiGLU's three matrices and two RMSNorms, a final RMSNorm."""
    d = model.n_embd
    if model.arch == "gpt":
        return vocab_size * d + model.block_size * d + model.n_layer * (12 * d * d + 2 * d) + d
    kv = d // model.n_head * model.kv_heads
    per_layer = 2 * d * d + 2 * d * kv + 3 * d * model.hidden + 2 * d
    return vocab_size * d * (1 if model.tie_embeddings else 2) + model.n_layer * per_layer + d


def tensors(model: Any) -> int:
    """Tensors of its state dict (``torch.save`` keeps a record for each)."""
    if model.arch == "gpt":
        return 3 + 6 * model.n_layer
    return 2 + (not model.tie_embeddings) + 9 * model.n_layer


def checkpoint_bytes(cfg: Any, vocab_size: int | None = None) -> int:
    """One checkpoint of a RunConfig's model on disk (trainer/checkpoint.py): fp32 weights and AdamW's
    two moments, torch.save's records per tensor, every rank's RNG state. ``vocab_size``: the real
    tokenizer's, once it is known (the configured one bounds a tokenizer trained for the run, not one
    loaded from ``tokenizer.path``; tests/test_disk_space.py holds it to a real checkpoint)."""
    m = cfg.model
    ranks = cfg.compute.nodes * cfg.compute.procs_per_node
    return (3 * FP32 * parameters(m, vocab_size or cfg.tokenizer.vocab_size) + tensors(m) * PER_TENSOR_BYTES
            + ranks * RNG_BYTES + EXTRA_BYTES)


def checkpoints_held(cfg: Any) -> int:
    """Checkpoints a run holds at its peak: ``checkpoint.keep_last_n`` kept, the one being written, and
    under a wsd schedule the stable (pre-decay) one, pinned for the next refresh."""
    return cfg.checkpoint.keep_last_n + 1 + (cfg.lr_schedule == "wsd")


def problems(cfg: Any, vocab_size: int | None = None) -> list[str]:
    """Every way ``cfg`` exceeds its ``limits`` (a RunConfig; empty when it fits), by field name; with
    ``vocab_size``, the model as it is built on the real tokenizer's vocabulary."""
    lim: LimitsConfig = cfg.limits
    vocab = vocab_size or cfg.tokenizer.vocab_size
    out = []
    for field, value, ceiling in (("compute.nodes", cfg.compute.nodes, lim.nodes),
                                  ("compute.procs_per_node", cfg.compute.procs_per_node, lim.procs_per_node),
                                  ("train.steps", cfg.train.steps, lim.steps),
                                  ("compute.threads_per_proc", cfg.compute.threads_per_proc, lim.threads_per_proc)):
        if value > ceiling:
            out.append(f"{field} ({value}) exceeds limits.{field.split('.')[1]} ({ceiling})")
    if (workers := cfg.preflight.workers) is not None and workers > lim.preflight_workers:
        out.append(f"preflight.workers ({workers}) exceeds limits.preflight_workers ({lim.preflight_workers})")
    if (train_bytes := cfg.tokenizer.train_max_bytes) is None or train_bytes > lim.tokenizer_train_bytes:
        out.append(f"tokenizer.train_max_bytes ({'null: every train file' if train_bytes is None else train_bytes}) "
                   f"exceeds limits.tokenizer_train_bytes ({lim.tokenizer_train_bytes})")
    if (n := parameters(cfg.model, vocab)) > lim.parameters:
        source = "tokenizer.vocab_size" if vocab_size is None else f"the tokenizer's {vocab:,} tokens"
        out.append(f"the model (model.*, {source}) has {n:,} parameters, over limits.parameters ({lim.parameters:,})")
    keep, peak = cfg.checkpoint.keep_last_n, checkpoints_held(cfg)
    disk = peak * checkpoint_bytes(cfg, vocab)
    if disk > lim.checkpoint_disk_gb * GB:
        out.append(f"checkpoint.keep_last_n ({keep}) + {peak - keep} checkpoints take about {disk / GB:.1f} GB, over limits.checkpoint_disk_gb ({lim.checkpoint_disk_gb:g})")
    return out
