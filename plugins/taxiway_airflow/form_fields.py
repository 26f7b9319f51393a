"""Which config fields the trigger form shows as fields of their own, titled in words and grouped
into the form's sections; every other field stays editable as its section's JSON under ADVANCED.

A form field's conf key is its dotted path with ``_`` for the dot (``train.lr`` → ``train_lr``),
so it never collides with a section key, which REST callers keep using (``{"train": {"lr": …}}``).
Descriptions, enums and bounds come from the RunConfig schema, not from here. Fields only the
deployment sets (``pipelines.config.trust``: the gate, the registry's names, compute.kubernetes,
refresh, limits) are never offered.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ADVANCED = "Advanced: every other field, as JSON per config section"


@dataclass(frozen=True)
class FormField:
    path: str                  # dotted RunConfig path: section.field
    title: str
    values_display: dict[str, str] = field(default_factory=dict)  # enum value → dropdown label
    examples: tuple[str, ...] = ()                                # suggestions for a free-text field

    @property
    def key(self) -> str:
        return self.path.replace(".", "_")

    @property
    def section(self) -> str:
        return self.path.split(".", 1)[0]

    @property
    def leaf(self) -> str:
        return self.path.split(".", 1)[1]


# form section (the accordion's title) → its fields, in form order
GROUPS: dict[str, tuple[FormField, ...]] = {
    "Data": (
        FormField("data.train", "Training documents"),
        FormField("data.manifest", "Data manifest"),
    ),
    "Tokenizer and packing": (
        FormField("tokenizer.vocab_size", "Vocabulary size"),
        FormField("pack.seq_len", "Sequence length"),
    ),
    "Model size": (
        FormField("model.n_layer", "Layers"),
        FormField("model.n_head", "Attention heads"),
        FormField("model.n_embd", "Width"),
        FormField("model.block_size", "Context length"),
        FormField("model.dropout", "Dropout"),
    ),
    "Training": (
        FormField("train.steps", "Steps"),
        FormField("train.batch_size", "Batch size per process"),
        FormField("train.grad_accum", "Gradient accumulation"),
        FormField("train.lr", "Learning rate (peak)"),
        FormField("train.min_lr", "Final learning rate"),
        FormField("train.warmup_steps", "Warmup steps"),
        FormField("train.decay", "Learning-rate decay"),
        FormField("train.seed", "Training seed"),
        FormField("train.parallel", "Data parallelism",
                  {"ddp": "DDP: a model replica per process", "fsdp": "FSDP2: the model sharded across processes"}),
        FormField("train.precision", "Precision",
                  {"auto": "auto: bf16 on GPU, fp32 on CPU", "fp32": "fp32", "bf16": "bf16 autocast"}),
        FormField("checkpoint.every_steps", "Checkpoint every (steps)"),
    ),
    "Compute": (
        FormField("compute.nodes", "Nodes"),
        FormField("compute.procs_per_node", "Processes per node"),
    ),
}

ALL_FIELDS: tuple[FormField, ...] = tuple(f for fields in GROUPS.values() for f in fields)

# titles of the scalar sections (their conf key is the section itself) and of each section's JSON
SECTION_TITLES = {
    "name": "Experiment name", "parent": "Continue from model", "data": "Data", "preflight": "Preflight",
    "tokenizer": "Tokenizer", "pack": "Packing", "model": "Model", "train": "Training", "checkpoint": "Checkpoints",
    "compute": "Compute", "eval": "Evaluation", "registry": "Registry", "refresh": "Refresh", "limits": "Limits",
    "alerts": "Alerts", "pretrained": "Start from a Hugging Face model",
}
