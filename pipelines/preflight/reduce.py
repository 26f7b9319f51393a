"""The preflight reduce: the four checks judged from the shard results, then the gate.

Everything the checks need was computed by the shard scans (``shards.py``); what is left is
cross-shard: the manifest's listing against the files found, document ids unique over the corpus
(Great Expectations over every row), duplicates by first occurrence in file order, and the LSH
index of train queried by val. Great Expectations' imports and first-use setup are most of the
documents check's time: with two or more workers a forked process does them while the shards
are scanned (``documents_process``), then validates the rows while this process judges the
other checks.
"""

from __future__ import annotations

import logging
from pathlib import Path

from pipelines import manifest
from pipelines.config import RunConfig
from pipelines.preflight.documents_check import check_documents, warm
from pipelines.preflight.duplicates import check_duplicates
from pipelines.preflight.forked import Ahead
from pipelines.preflight.manifest_check import OnDisk, check_manifest
from pipelines.preflight.overlap import Signed, TrainIndex, judge_overlap
from pipelines.preflight.report import CHECK_NAMES, CheckResult
from pipelines.preflight.shards import Shard, ShardResult
from pipelines.run_folder import RunFolder
from trainer import fsio

log = logging.getLogger("taxiway.preflight")


def documents_process(cfg: RunConfig, workers: int) -> Ahead[CheckResult]:
    """The documents check, Great Expectations' imports started now in a process of its own when
    there are two or more workers (the caller sends the rows later: ``reduce``)."""
    return Ahead(lambda: warm(cfg), lambda rows: check_documents(cfg, rows), enabled=workers > 1)


class Judging:
    """The checks' inputs gathered shard by shard, in whatever order the shard results arrive
    (``add``): the files found for the manifest check, train signatures into the LSH index, val
    signatures set aside. So what is left once the last shard is in (``finish``) is only the work
    that needs every shard — the serial tail of a stage whose other parts run on every worker."""

    def __init__(self, cfg: RunConfig, shards: list[Shard]) -> None:
        self.cfg, self.shards = cfg, shards
        self.results: dict[int, ShardResult] = {}
        self.found: dict[str, OnDisk] = {split: {} for split in manifest.SPLITS}
        self.index = TrainIndex(cfg)
        self.val: dict[int, Signed] = {}

    def add(self, i: int, result: ShardResult) -> None:
        shard, self.results[i] = self.shards[i], result
        for f, (_, size, sha) in zip(shard.files, result.files, strict=True):
            self.found[shard.split][f.path] = (f.uri, size, sha)
        signed = Signed(result.ids, result.sigs)
        if result.split == "train":
            self.index.add(signed)  # insertion order changes no verdict: candidates are sets, pairs sorted
        else:
            self.val[i] = signed

    def finish(self, run_dir: Path, documents: Ahead[CheckResult]) -> dict[str, CheckResult]:
        """Judge every check and save each under ``<run>/preflight/checks/``; record the shard keys
        used in ``<run>/preflight/shards.json``. The documents check runs in ``documents``
        (``documents_process``) while this process judges the others."""
        cfg, folder = self.cfg, RunFolder(run_dir)
        results = [self.results[i] for i in range(len(self.shards))]
        fsio.write_json(folder.preflight_shards, {"shards": [
            {"id": s.id, "split": s.split, "files": len(s.files), "bytes": s.bytes, "key": r.key,
             "cache_hit": r.cache_hit} for s, r in zip(self.shards, results, strict=True)]})
        documents.submit([row for r in results for row in r.rows])
        val = Signed.join([self.val[i] for i in sorted(self.val)], cfg.preflight.num_perm)
        checks = {"manifest": check_manifest(cfg, self.found),
                  "duplicates": check_duplicates(cfg, ((r.split, doc, digest) for r in results
                                                       for doc, digest in r.digests)),
                  "overlap": judge_overlap(cfg, self.index, val, manifest.root_of(cfg.data.manifest),
                                           folder.overlap_plot)}
        checks["documents"] = documents.result()
        for name in CHECK_NAMES:
            fsio.write_json(folder.preflight_check(name), checks[name].to_json())
            log.info("[%s] %s: %s", "ok" if checks[name].passed else "FAIL", name, checks[name].message)
        return checks


def reduce(cfg: RunConfig, run_dir: Path, shards: list[Shard], results: list[ShardResult],
           documents: Ahead[CheckResult]) -> dict[str, CheckResult]:
    """Judge every check from ``results`` (one per shard, in shard order): ``Judging`` fed at once."""
    judging = Judging(cfg, shards)
    for i, result in enumerate(results):
        judging.add(i, result)
    return judging.finish(run_dir, documents)
