"""Lineage: what a registered model was made from, as MLflow tags, dataset inputs and artifacts.

Months later a version's tags answer "which data, tokenizer, code, config and parent made this,
and how did it score against what": every value is a content hash, a version, or a figure.
No MLflow here: ``runs`` logs what this module lists.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines import manifest
from pipelines.config import RunConfig
from pipelines.preflight.decontaminate import effective_data
from pipelines.registry.client import WEIGHTS_TAG
from pipelines.run_folder import RunFolder
from trainer import fsio


def flatten(obj: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"train": {"lr": 1}}`` → ``{"train.lr": 1}``."""
    out: dict[str, Any] = {}
    for key, value in obj.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{path}."))
        else:
            out[path] = value
    return out


def packed_info(run_dir: Path) -> dict[str, Any]:
    pointer = json.loads(RunFolder(run_dir).packed_link.read_text())
    packed = json.loads((Path(pointer["path"]) / "manifest.json").read_text())
    return {"path": pointer["path"], "key": pointer["key"], "manifest": packed}


def parent_version(cfg: RunConfig, run_dir: Path) -> str:
    """The parent as the concrete version training started from (an alias may have moved since)."""
    if not cfg.parent:
        return "none"
    for folder in sorted(RunFolder(run_dir).parent.glob("*-v*")):
        name, _, version = folder.name.rpartition("-v")
        if version.isdigit():
            return f"models:/{name}/{version}"
    return cfg.parent


def pretrained_origin(cfg: RunConfig, run_dir: Path) -> str:
    """The Hugging Face folder training started from, with the sha256 of its weight files as fetched."""
    if not cfg.pretrained:
        return "none"
    files = sorted(RunFolder(run_dir).pretrained.glob("*.safetensors"))
    digest = hashlib.sha256("".join(fsio.sha256_file(f) for f in files).encode()).hexdigest()
    return f"{cfg.pretrained} (weights sha256 {digest})"


def tags(cfg: RunConfig, run_dir: Path, eval_report: dict[str, Any], code_version: str,
         airflow: dict[str, str]) -> dict[str, str]:
    """The model version's lineage tags (docs/architecture.md, contracts) and its evaluation against the baseline."""
    packed = packed_info(run_dir)
    out = {
        "taxiway.config_sha256": cfg.sha256(),
        "taxiway.data_manifest_sha256": manifest.digest(effective_data(cfg, run_dir).data.manifest),
        "taxiway.packed_dataset": packed["key"],
        "taxiway.tokenizer_sha256": packed["manifest"]["tokenizer_sha256"],
        WEIGHTS_TAG: fsio.sha256_file(RunFolder(run_dir).model / "model.safetensors"),
        "taxiway.code_version": code_version,
        "taxiway.parent_model": parent_version(cfg, run_dir),
        "taxiway.pretrained": pretrained_origin(cfg, run_dir),
        "taxiway.run_dir": str(run_dir),
        **{f"airflow.{k}": str(v) for k, v in airflow.items()},
    }
    return {**out, **eval_tags(eval_report)}


def eval_tags(eval_report: dict[str, Any]) -> dict[str, str]:
    """The evaluation part of the tags, rewritten when a re-evaluation replaces the report."""
    c, b, g = eval_report["candidate"], eval_report["baseline"], eval_report["gate"]
    return {
        "taxiway.baseline": b["label"],
        "taxiway.baseline_version": f"models:/{b['name']}/{b['version']}" if b.get("version") else "none",
        "taxiway.eval.passed": str(eval_report["passed"]).lower(),
        "taxiway.eval.loss": f"{c['loss']:.6f}",
        "taxiway.eval.perplexity": f"{c['perplexity']:.4f}",
        "taxiway.eval.bits_per_byte": f"{c['bits_per_byte']:.6f}",
        "taxiway.eval.baseline_bits_per_byte": f"{b['bits_per_byte']:.6f}",
        "taxiway.eval.delta_bits_per_byte": f"{-g['improvement_bpb']:+.6f}",
        "taxiway.eval.lower_bound_bpb": f"{g['lower_bpb']:+.6f}",
        "taxiway.eval.confidence": f"{g['confidence']}",
        "taxiway.eval.bootstrap": f"{g['units']} {g['unit']}s x {g['samples']} resamples, seed {g['seed']}",
        **_refresh_tags(eval_report.get("refresh")),
    }


def _refresh_tags(refresh: dict[str, Any] | None) -> dict[str, str]:
    """A refresh's second set: the held-out new data, and the fixed set's allowed regression."""
    if not refresh:
        return {}
    fresh = refresh["fresh"]
    return {"taxiway.eval.new_data.bits_per_byte": f"{fresh['candidate']['bits_per_byte']:.6f}",
            "taxiway.eval.new_data.baseline_bits_per_byte": f"{fresh['baseline']['bits_per_byte']:.6f}",
            "taxiway.eval.new_data.lower_bound_bpb": f"{fresh['gate']['lower_bpb']:+.6f}",
            "taxiway.eval.max_regression_bpb": f"{refresh['fixed']['max_regression_bpb']}"}


@dataclass(frozen=True)
class DatasetRef:
    """A dataset input of the MLflow run: where it lives, its content digest, what it was used for."""

    name: str
    source: str
    digest: str
    context: str
    tags: dict[str, str]


def _split_digest(entries: list[manifest.Entry], split: str) -> tuple[str, int, int]:
    rows = sorted((e.path, e.sha256) for e in entries if e.split == split)
    digest = hashlib.sha256(json.dumps(rows).encode()).hexdigest()
    return digest, len(rows), sum(e.bytes for e in entries if e.split == split)


def datasets(cfg: RunConfig, run_dir: Path) -> list[DatasetRef]:
    """The train and (possibly decontaminated) val splits as listed by the data manifest, and the
    packed dataset the model actually read."""
    data = effective_data(cfg, run_dir).data
    entries = manifest.read(data.manifest)
    out = []
    for split, folder, context in (("train", data.train, "training"), ("val", data.val, "evaluation")):
        digest, files, nbytes = _split_digest(entries, split)
        out.append(DatasetRef(f"{cfg.name}-{split}", folder, digest[:32], context,
                              {"manifest": str(data.manifest), "split": split, "files": str(files),
                               "bytes": str(nbytes), "sha256": digest}))
    packed = packed_info(run_dir)
    out.append(DatasetRef(f"{cfg.name}-packed", packed["path"], packed["key"], "training",
                          {"seq_len": str(packed["manifest"]["seq_len"]),
                           "tokenizer_sha256": packed["manifest"]["tokenizer_sha256"],
                           "windows": json.dumps({s: v["windows"] for s, v in packed["manifest"]["splits"].items()})}))
    return out


def artifacts(run_dir: Path) -> list[tuple[Path, str]]:
    """(file, artifact folder) pairs to log; absent optional files are skipped."""
    packed, folder = Path(packed_info(run_dir)["path"]), RunFolder(run_dir)
    wanted = [
        (folder.config, "config"),
        (folder.preflight_report, "preflight"),
        (folder.preflight_summary, "preflight"),
        (folder.overlap_plot, "preflight"),
        (packed / "manifest.json", "packed"),
        (packed / "tokenizer.json", "tokenizer"),
        (folder.status, "train"),
        *eval_artifacts(run_dir),
    ]
    return [(path, dest) for path, dest in wanted if path.exists()]


def final_checkpoint(run_dir: Path) -> Path | None:
    """The valid checkpoint the run's model was exported from (None once pruned or never written)."""
    from trainer import checkpoint  # torch (~1 s): DAG parse must not pay for it

    step = json.loads((RunFolder(run_dir).model / "model.json").read_text()).get("global_step")
    return checkpoint.at_step(RunFolder(run_dir).checkpoints, step) if isinstance(step, int) else None


def eval_artifacts(run_dir: Path) -> list[tuple[Path, str]]:
    folder = RunFolder(run_dir).eval
    return [(folder / name, "eval") for name in ("report.json", "report.md", "comparison.png", "per_unit.csv")
            if (folder / name).exists()]

