"""Preflight, the data gate that runs before any compute is spent (docs/preflight.md):
``plan`` cuts the corpus into shards; ``shard`` reads one shard's files once and computes what
every check needs, cached by content; ``reduce`` judges the four checks from the shard results
(``<run>/preflight/checks/``) and folds them into ``<run>/preflight/report.json``, the gate.
Airflow maps the shards over tasks; ``run`` scans them on forked worker processes."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from pipelines.config import RunConfig
from pipelines.preflight import documents_check
from pipelines.preflight import shards as sharding
from pipelines.preflight.decontaminate import decontaminate
from pipelines.preflight.forked import split_map
from pipelines.preflight.overlap import warm as warm_overlap
from pipelines.preflight.reduce import Judging, documents_process
from pipelines.preflight.reduce import reduce as judge
from pipelines.preflight.report import CHECK_NAMES, CheckResult, Report, assemble
from pipelines.preflight.shards import ShardResult
from pipelines.run_folder import RunFolder
from trainer import fsio

log = logging.getLogger("taxiway.preflight")


def plan(cfg: RunConfig, run_dir: Path, *, min_shards: int = 1, max_shards: int | None = None) -> list[int]:
    """Remove an earlier attempt's results, cut the corpus into shards and save the plan; the shard
    ids (what the Airflow scan tasks map over)."""
    folder = RunFolder(run_dir)
    for stale in [*map(folder.preflight_check, CHECK_NAMES), folder.preflight_report, folder.effective_data,
                  folder.preflight_shards]:
        stale.unlink(missing_ok=True)
    shards = sharding.plan(cfg, min_shards, max_shards)
    sharding.write_plan(run_dir, shards)
    log.info("%d shard(s): %s", len(shards), ", ".join(f"{s.split} {len(s.files)} files {s.bytes} B" for s in shards))
    return [s.id for s in shards]


def shard(cfg: RunConfig, run_dir: Path, shard_id: int) -> ShardResult:
    """One shard of the saved plan, scanned (or loaded from the cache)."""
    return sharding.scan(cfg, sharding.read_plan(run_dir)[shard_id])


def reduce(cfg: RunConfig, run_dir: Path, keys: list[str], workers: int | None = None) -> Report:
    """The checks judged from the cached shard results ``keys`` (in shard order), then the gate."""
    with documents_process(cfg, _workers(cfg, workers)) as documents:
        judge(cfg, run_dir, sharding.read_plan(run_dir), [sharding.load(k) for k in keys], documents)
    return _gate(cfg, run_dir)


def run(cfg: RunConfig, run_dir: Path, workers: int | None = None) -> Report:
    """Plan, scan every shard on ``workers`` forked processes (largest first, so the last ones
    to finish are small), reduce, gate. The documents check's process starts first, so its
    imports overlap the scans, and this process imports what the overlap check needs while the
    other workers start scanning."""
    workers = _workers(cfg, workers)
    with documents_process(cfg, workers) as documents:
        plan(cfg, run_dir, min_shards=4 * workers if workers > 1 else 1)
        shards = sharding.read_plan(run_dir)
        order = sorted(range(len(shards)), key=lambda i: -shards[i].bytes)
        judging = Judging(cfg, shards)
        for j, result in split_map(lambda i: sharding.scan(cfg, shards[i]), order, workers, before=warm_overlap):
            judging.add(order[j], result)  # between this process's own scans: less left after the last
        judging.finish(run_dir, documents)
    return _gate(cfg, run_dir)


def preload() -> None:
    """Import Great Expectations now, quietly: a worker process that forks its tasks pays it once."""
    documents_check.quiet_ge()


def _workers(cfg: RunConfig, workers: int | None) -> int:
    return workers or cfg.preflight.workers or os.cpu_count() or 1


def _gate(cfg: RunConfig, run_dir: Path) -> Report:
    """Fold the saved check results into the report; a missing check counts as failed."""
    results = _saved_checks(run_dir)
    cleaned = _decontaminate(cfg, run_dir, results)
    report = assemble(list(results.values()), decontamination=cleaned)
    folder = RunFolder(run_dir)
    fsio.write_json(folder.preflight_report, report.to_json())
    fsio.write_text(folder.preflight_summary, report.markdown())
    return report


def _saved_checks(run_dir: Path) -> dict[str, CheckResult]:
    out = {}
    for name in CHECK_NAMES:
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
