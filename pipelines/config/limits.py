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
PER_TENSOR_BYTES = 1 << 10  # zip records and pickle of a weight, its two moments and step count (~1.2 KB measured)
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
    trigger_may_set: list[Annotated[str, Field(pattern=r"^[a-z_]+(\.[a-z_]+)*$", max_length=128)]] = Field(
        [], max_length=64, description="Deployment-owned fields (dotted paths or sections) this deployment lets "
                                       "a trigger set; empty = none (docs/security.md)")
    trigger_may_choose: list[Annotated[str, Field(pattern=r"^[^\x00]+\.ya?ml$", max_length=256)]] = Field(
        [], max_length=32, description="Config files (relative to this config's folder, or absolute) a trigger "
                                       "may name as its ``config``; whichever it names, every deployment-owned "
                                       "field still comes from this config; empty = none (docs/security.md)")


def parameters(model: Any, vocab_size: int) -> int:
    """Parameters of ``trainer.model.GPT``: tied token embedding, position embedding, per block the
    attention (qkv, proj) and MLP (4x) weights and two bias-free LayerNorms, and the final LayerNorm."""
    d = model.n_embd
    return vocab_size * d + model.block_size * d + model.n_layer * (12 * d * d + 2 * d) + d


def checkpoint_bytes(cfg: Any) -> int:
    """One checkpoint of a RunConfig's model on disk (trainer/checkpoint.py): fp32 weights and AdamW's
    two moments, torch.save's records per tensor, every rank's RNG state. The configured vocabulary
    bounds a tokenizer trained for the run (tests/test_disk_space.py holds it to a real checkpoint)."""
    m = cfg.model
    ranks = cfg.compute.nodes * cfg.compute.procs_per_node
    return (3 * FP32 * parameters(m, cfg.tokenizer.vocab_size) + (3 + 6 * m.n_layer) * PER_TENSOR_BYTES
            + ranks * RNG_BYTES + EXTRA_BYTES)


def checkpoints_held(cfg: Any) -> int:
    """Checkpoints a run holds at its peak: ``checkpoint.keep_last_n`` kept, the one being written, and
    under a wsd schedule the stable (pre-decay) one, pinned for the next refresh."""
    return cfg.checkpoint.keep_last_n + 1 + (cfg.lr_schedule == "wsd")


def problems(cfg: Any) -> list[str]:
    """Every way ``cfg`` exceeds its ``limits`` (a RunConfig; empty when it fits), by field name."""
    lim: LimitsConfig = cfg.limits
    out = []
    for field, value, ceiling in (("compute.nodes", cfg.compute.nodes, lim.nodes),
                                  ("compute.procs_per_node", cfg.compute.procs_per_node, lim.procs_per_node),
                                  ("train.steps", cfg.train.steps, lim.steps)):
        if value > ceiling:
            out.append(f"{field} ({value}) exceeds limits.{field.split('.')[1]} ({ceiling})")
    if (n := parameters(cfg.model, cfg.tokenizer.vocab_size)) > lim.parameters:
        out.append(f"the model (model.*, tokenizer.vocab_size) has {n:,} parameters, over limits.parameters "
                   f"({lim.parameters:,})")
    keep, peak = cfg.checkpoint.keep_last_n, checkpoints_held(cfg)
    disk = peak * checkpoint_bytes(cfg)
    if disk > lim.checkpoint_disk_gb * GB:
        out.append(f"checkpoint.keep_last_n ({keep}) + {peak - keep} checkpoints take about {disk / GB:.1f} GB, over limits.checkpoint_disk_gb ({lim.checkpoint_disk_gb:g})")
    return out
