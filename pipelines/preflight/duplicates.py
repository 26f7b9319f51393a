"""Exact duplicates by normalized-text hash: within train, within val, and across the splits.

Normalization: Unicode NFKC, lower case, runs of whitespace collapsed — so a copy that differs
only in case or spacing still counts. A duplicate is a document whose hash an earlier document
(in file order) already had; the first copy is not counted. Across splits every val copy of a
train document is listed (decontamination drops them all).
"""

from __future__ import annotations

import hashlib
import unicodedata
from collections.abc import Iterable

from pipelines import manifest
from pipelines.config import RunConfig
from pipelines.preflight.report import CheckResult

_MAX_LISTED = 50


def normalized_hash(text: str) -> str:
    """Whitespace runs (``str.isspace``: the characters ``re``'s ``\\s`` matches, a test checks every
    code point) become one space, the ends none: ``split``/``join`` costs a quarter of ``re.sub``."""
    norm = " ".join(unicodedata.normalize("NFKC", text).lower().split())
    return hashlib.blake2b(norm.encode(), digest_size=16).hexdigest()


def check_duplicates(cfg: RunConfig, docs: Iterable[tuple[str, str, str]]) -> CheckResult:
    """``docs``: (split, doc id, normalized hash) of every readable document, train then val, in file order."""
    first: dict[str, dict[str, str]] = {s: {} for s in manifest.SPLITS}
    within: dict[str, list[dict[str, str]]] = {s: [] for s in manifest.SPLITS}
    totals = {s: 0 for s in manifest.SPLITS}
    across: list[dict[str, str]] = []   # every val document that copies a train document, repeats included
    within_val_of_train = 0             # within-val duplicates that also copy train (decontamination drops them)
    for split, key, digest in docs:
        totals[split] += 1
        copies_train = split == "val" and digest in first["train"]  # train is complete by now
        if copies_train:
            across.append({"val": key, "train": first["train"][digest]})
        if digest in first[split]:
            within[split].append({"doc": key, "duplicate_of": first[split][digest]})
            within_val_of_train += copies_train
        else:
            first[split][digest] = key
    fractions = {s: len(within[s]) / max(1, totals[s]) for s in manifest.SPLITS}
    across_fraction = len(across) / max(1, totals["val"])
    limit_dup, limit_overlap = cfg.preflight.max_duplicate_fraction, cfg.preflight.max_overlap_fraction
    passed = all(f <= limit_dup for f in fractions.values()) and across_fraction <= limit_overlap
    message = (f"exact duplicates: train {len(within['train'])} ({fractions['train']:.2%}), "
               f"val {len(within['val'])} ({fractions['val']:.2%}), limit {limit_dup:.2%}; "
               f"val copies of train {len(across)} ({across_fraction:.2%}), limit {limit_overlap:.2%}")
    if not passed:
        named = [d["doc"] for s in manifest.SPLITS for d in within[s]] + [a["val"] for a in across]
        message += "; e.g. " + ", ".join(named[:10])
    return CheckResult("duplicates", passed, message, {
        "fractions": fractions, "across_fraction": across_fraction, "documents": totals,
        "within": {s: within[s][:_MAX_LISTED] for s in manifest.SPLITS},
        "within_counts": {s: len(within[s]) for s in manifest.SPLITS}, "within_val_of_train": within_val_of_train,
        "across": across, "across_count": len(across)})
