"""Lineage: what a registered model was made from, as MLflow tags and artifacts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipelines import manifest
from pipelines.config import RunConfig
from pipelines.preflight.decontaminate import effective_data


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
    pointer = json.loads((run_dir / "tokenize" / "packed.json").read_text())
    packed = json.loads((Path(pointer["path"]) / "manifest.json").read_text())
    return {"path": pointer["path"], "key": pointer["key"], "manifest": packed}


def tags(cfg: RunConfig, run_dir: Path, eval_report: dict[str, Any], code_version: str,
         airflow: dict[str, str]) -> dict[str, str]:
    packed = packed_info(run_dir)
    base = eval_report["baseline"]
    out = {
        "taxiway.config_sha256": cfg.sha256(),
        "taxiway.data_manifest_sha256": manifest.digest(effective_data(cfg, run_dir).data.manifest),
        "taxiway.packed_dataset": packed["key"],
        "taxiway.tokenizer_sha256": packed["manifest"]["tokenizer_sha256"],
        "taxiway.code_version": code_version,
        "taxiway.parent_model": cfg.parent or "none",
        "taxiway.baseline": f"{base.get('kind')}:{base.get('uri') or '-'}",
        "taxiway.eval.passed": str(eval_report["passed"]).lower(),
        "taxiway.eval.bits_per_byte": f"{eval_report['candidate']['bits_per_byte']:.6f}",
        "taxiway.eval.loss": f"{eval_report['candidate']['loss']:.6f}",
        "taxiway.eval.baseline_bits_per_byte": f"{base['bits_per_byte']:.6f}",
        "taxiway.eval.delta_bits_per_byte": f"{-eval_report['improvement_bpb']:+.6f}",
        "taxiway.run_dir": str(run_dir),
    }
    out.update({f"airflow.{k}": str(v) for k, v in airflow.items()})
    return out


def artifacts(run_dir: Path) -> list[tuple[Path, str]]:
    """(file, artifact folder) pairs to log; absent optional files are skipped."""
    packed = Path(packed_info(run_dir)["path"])
    wanted = [
        (run_dir / "config.yaml", "config"),
        (run_dir / "preflight" / "report.json", "preflight"),
        (run_dir / "preflight" / "report.md", "preflight"),
        (run_dir / "preflight" / "overlap.png", "preflight"),
        (packed / "manifest.json", "packed"),
        (run_dir / "eval" / "report.json", "eval"),
        (run_dir / "eval" / "report.md", "eval"),
        (run_dir / "status.json", "train"),
    ]
    return [(path, dest) for path, dest in wanted if path.exists()]
