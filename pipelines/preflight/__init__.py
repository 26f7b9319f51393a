"""Preflight: the data gate that runs before any compute is spent.

Each check is a function ``(cfg, run_dir) -> CheckResult`` saved under
``<run>/preflight/checks/``; ``gate`` folds them into ``<run>/preflight/report.json`` (schema:
docs/preflight.md). Airflow runs one task per check; the CLI and tests call ``run``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from pipelines.config import RunConfig
from pipelines.preflight.decontaminate import decontaminate
from pipelines.preflight.documents_check import check_documents
from pipelines.preflight.duplicates import check_duplicates
from pipelines.preflight.manifest_check import check_manifest
from pipelines.preflight.overlap import check_overlap
from pipelines.preflight.report import CHECK_NAMES, CheckResult, Report, assemble
from pipelines.run_folder import RunFolder
from trainer import fsio

log = logging.getLogger("taxiway.preflight")

CHECKS: dict[str, Callable[[RunConfig, Path], CheckResult]] = {
    "manifest": lambda cfg, run_dir: check_manifest(cfg),
    "documents": lambda cfg, run_dir: check_documents(cfg),
    "duplicates": lambda cfg, run_dir: check_duplicates(cfg),
    "overlap": lambda cfg, run_dir: check_overlap(cfg, RunFolder(run_dir).overlap_plot),
}
assert tuple(CHECKS) == CHECK_NAMES


def run_check(name: str, cfg: RunConfig, run_dir: Path) -> CheckResult:
    result = CHECKS[name](cfg, Path(run_dir))
    fsio.write_json(RunFolder(run_dir).preflight_check(name), result.to_json())
    return result


def _load(run_dir: Path) -> dict[str, CheckResult]:
    out = {}
    for name in CHECKS:
        path = RunFolder(run_dir).preflight_check(name)
        out[name] = (CheckResult.load(path) if path.exists()
                     else CheckResult(name, False, "check did not run (it raised; see its log)", {}))
    return out


def _within_ok_after_drop(cfg: RunConfig, d: dict) -> bool:
    """Within-split duplicate fractions once the val copies of train documents are gone."""
    if not d:
        return False
    val_left = d["documents"]["val"] - d["across_count"]
    fractions = {"train": d["fractions"]["train"],
                 "val": (d["within_counts"]["val"] - d["within_val_of_train"]) / max(1, val_left)}
    return all(f <= cfg.preflight.max_duplicate_fraction for f in fractions.values())


def _decontaminate(cfg: RunConfig, run_dir: Path, results: dict[str, CheckResult]) -> dict | None:
    """With ``action: decontaminate``, contamination alone no longer fails the gate: the val
    documents that overlap train (near or exact) are dropped and the checks re-judged."""
    overlap, dups = results["overlap"], results["duplicates"]
    within_ok = _within_ok_after_drop(cfg, dups.details)
    others_ok = all(r.passed for n, r in results.items() if n not in ("overlap", "duplicates"))
    if cfg.preflight.action != "decontaminate" or not others_ok or not within_ok or overlap.details == {}:
        return None
    if overlap.passed and dups.passed:
        return None
    drop = set(overlap.details.get("contaminated", [])) | {a["val"] for a in dups.details.get("across", [])}
    effective = decontaminate(cfg, run_dir, drop)
    note = f"decontaminated: dropped {len(drop)} val document(s); continuing with {effective['val']}"
    for name in ("overlap", "duplicates"):
        r = results[name]
        results[name] = CheckResult(name, True, f"{r.message}; {note}", r.details)
    return {"dropped": sorted(drop), **effective}


def gate(cfg: RunConfig, run_dir: Path) -> Report:
    """Fold the saved check results into the report; a missing check counts as failed."""
    results = _load(run_dir)
    cleaned = _decontaminate(cfg, run_dir, results)
    report = assemble(list(results.values()), decontamination=cleaned)
    folder = RunFolder(run_dir)
    fsio.write_json(folder.preflight_report, report.to_json())
    fsio.write_text(folder.preflight_summary, report.markdown())
    return report


def run(cfg: RunConfig, run_dir: Path) -> Report:
    """All checks, then the gate. Results of an earlier attempt are removed first."""
    folder = RunFolder(run_dir)
    for stale in [*map(folder.preflight_check, CHECKS), folder.preflight_report, folder.effective_data]:
        stale.unlink(missing_ok=True)
    for name in CHECKS:
        result = run_check(name, cfg, run_dir)
        log.info("[%s] %s: %s", "ok" if result.passed else "FAIL", name, result.message)
    return gate(cfg, run_dir)
