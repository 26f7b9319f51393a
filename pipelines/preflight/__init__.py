"""Preflight: the data gate that runs before any compute is spent.

Each check is a function ``(cfg, run_dir) -> CheckResult`` saved under
``<run>/preflight/checks/``; ``gate`` folds them into ``<run>/preflight/report.json``.
Airflow runs one task per check; the CLI and tests call ``run``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pipelines import atomic
from pipelines.config import RunConfig
from pipelines.preflight.manifest_check import check_manifest
from pipelines.preflight.overlap import check_overlap
from pipelines.preflight.report import CheckResult, Report, assemble

CHECKS: dict[str, Callable[[RunConfig, Path], CheckResult]] = {
    "manifest": lambda cfg, run_dir: check_manifest(cfg),
    "overlap": lambda cfg, run_dir: check_overlap(cfg, run_dir / "preflight" / "overlap.png"),
}


def folder(run_dir: Path) -> Path:
    return Path(run_dir) / "preflight"


def run_check(name: str, cfg: RunConfig, run_dir: Path) -> CheckResult:
    result = CHECKS[name](cfg, Path(run_dir))
    result.save(folder(run_dir) / "checks")
    return result


def gate(run_dir: Path) -> Report:
    """Fold the saved check results into the report; a missing check counts as failed."""
    checks_dir = folder(run_dir) / "checks"
    results = []
    for name in CHECKS:
        path = checks_dir / f"{name}.json"
        results.append(CheckResult.load(path) if path.exists()
                       else CheckResult(name, False, "check did not run", {}))
    report = assemble(results)
    atomic.write_json(folder(run_dir) / "report.json", report.to_json())
    atomic.write_text(folder(run_dir) / "report.md", report.summary() + "\n")
    return report


def run(cfg: RunConfig, run_dir: Path) -> Report:
    """All checks, then the gate. Stale results from an earlier attempt are removed first."""
    checks_dir = folder(run_dir) / "checks"
    for stale in [*checks_dir.glob("*.json"), folder(run_dir) / "report.json"]:
        stale.unlink(missing_ok=True)
    for name in CHECKS:
        run_check(name, cfg, run_dir)
    return gate(run_dir)
