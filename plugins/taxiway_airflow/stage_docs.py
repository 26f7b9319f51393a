"""What each stage's task group says in the Airflow UI (tooltip and Docs): what it does and where
its outputs go, so a user finds them without reading code. Paths are those of
``pipelines.run_folder``; ``<run>`` is ``$TAXIWAY_HOME/runs/<Airflow run id>``."""

from __future__ import annotations

from typing import NamedTuple


class StageDoc(NamedTuple):
    tooltip: str
    doc_md: str


STAGES: dict[str, StageDoc] = {
    "preflight": StageDoc(
        "Data gate before any compute: manifest, documents, duplicates, train/val overlap",
        """**Preflight**: every data file checked against the manifest (count, bytes, sha256), document
expectations, exact duplicates and MinHash train/val near-duplicates. `plan` cuts the corpus into
shards of about `preflight.shard_bytes`; `scan` (one mapped task per shard) reads each file once
for every check, cached by content, so a retried or re-run shard is a cache hit; `gate` judges the
checks from the shard results and fails the run when one fails, naming it and why (or drops
contaminated val documents with `preflight.action: decontaminate`).

Outputs: `<run>/preflight/report.json` and `report.md`, `overlap.png`, one `checks/<check>.json` per
check, `plan.json` and `shards.json` (the shards and their cache keys), `clean/` (the decontaminated
val split). Thresholds: the deployment's `preflight.*` limits, which keep the gate's validation set clean
(docs/security.md).""",
    ),
    "tokenize": StageDoc(
        "Byte-level BPE and fixed-length packed windows, cached by content",
        """**Tokenize**: `tokenizer` trains a byte-level BPE on the train split (or takes the parent's)
and cuts the file groups into shards of about `pack.shard_bytes`; each mapped `shard` task encodes
its groups into the token cache on one core; `pack` joins the documents by end-of-text into
`seq_len + 1` token windows with a document-boundary index. The tokenizer starts when the
preflight scans are done, so it and the shards run beside the gate; `pack` waits for the gate, so
nothing is trained on data it refused.
Every file is checked against its manifest sha256 as it is read (a changed file is an error naming
it), so the cache holds only what the manifest names. Unchanged inputs are a cache hit (the task
logs say so), so a retried shard redoes only what it had not cached.

Outputs: `$TAXIWAY_HOME/cache/packed/<content hash>/` (shards, index, `manifest.json`, tokenizer),
linked from `<run>/tokenize/packed.json`; the plan in `<run>/tokenize/shards/`.""",
    ),
    "train": StageDoc(
        "A seconds-long smoke run, then the training gang; resumes from the newest checkpoint",
        """**Train**: `smoke` runs a few steps in one process (fails fast on a bad config), then the gang
(`compute.nodes` x `compute.procs_per_node` processes, DDP or FSDP) trains; the waiting task logs
step/total, loss and tokens/s and ships the curve to MLflow live. A restarted or cleared task
resumes from the newest valid checkpoint.

Outputs: `<run>/checkpoints/step-NNNNNNNN/`, `<run>/status.json`, `<run>/metrics.jsonl`, the
exported model in `<run>/model/`, node logs in `<run>/train/logs/attempt-N/`.""",
    ),
    "evaluate": StageDoc(
        "Candidate vs the baseline in bits per byte; paired bootstrap decides the gate",
        """**Evaluate**: scores the candidate and the baseline (`eval.baseline`: the registered champion,
else the floor) on the validation set in bits per byte; a paired bootstrap at `eval.confidence`
decides whether the candidate is better. A failed gate does not fail the run: the model is then
registered as challenger.

Outputs: `<run>/eval/report.json`, `<run>/eval/report.md` (with `comparison.png`), `per_unit.csv`.""",
    ),
    "register": StageDoc(
        "MLflow run and model version with lineage; champion alias only on a passed gate",
        """**Register**: completes the MLflow run (experiment = config name: params, curves, artifacts) and
adds a version of `registry.model_name` with lineage tags; the `champion` alias moves only when the
gate passed, else the version becomes `challenger`.

Outputs: `<run>/registry.json` (model version, alias, MLflow run id), the MLflow run's artifacts
(config, reports, plots, model).""",
    ),
    "sweep": StageDoc(
        "The sweep's members: one run folder per point; then their ranking by val bits/byte",
        """**Sweep**: `members` writes one run folder per point of the `sweep` param (config = the run's
config + the point), each reusing this run's preflight report and packed data; `rank` reads every
member's evaluation (one val set) and ranks them by the candidate's bits per byte, failed members
listed as failed; the sweep goes on when at least one member was evaluated.

Outputs: `<run>/sweep/points.json`, `members.json`, `<run>/sweep/NN/` (a run folder per member),
`<run>/sweep/ranking.json` and `ranking.md`.""",
    ),
    "member": StageDoc(
        "One sweep member per mapped index: smoke, training gang, final checkpoint, evaluation",
        """**Member** (mapped: one per point, in parallel): the train stage's `smoke`, `gang` and
`final_checkpoint`, then `score` evaluates it against the baseline on the shared val set, in the
member's own run folder; its curve ships to its own MLflow run (a child of the sweep's).

Outputs: `<run>/sweep/NN/` (checkpoints, status.json, metrics.jsonl, model/, eval/report.json).""",
    ),
    "register_best": StageDoc(
        "Members as child MLflow runs of the sweep's run; only the best becomes a model version",
        """**Register**: logs the sweep's MLflow run (parent) and one child run per member (its point,
curve and evaluation; failed members ended FAILED), then registers only the best member as a
version of `registry.model_name`, with the single run's lineage tags and champion logic: the
`champion` alias moves only when its gate passed, else it becomes `challenger`.

Outputs: `<run>/registry.json` (model version, alias, the best member, the parent MLflow run), the
best member's `<run>/sweep/NN/registry.json`.""",
    ),
}
