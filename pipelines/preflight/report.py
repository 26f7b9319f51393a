"""The preflight report: one result per check, and the gate's verdict over all of them.

Schema (stable; documented in docs/preflight.md): ``{passed, created_at, checks: {name:
{passed, message, details}}, overlap: {contaminated_fraction, pairs}, decontamination}``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
CHECK_NAMES = ("manifest", "documents", "duplicates", "overlap")  # one checks/<name>.json each


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass
class CheckResult:
    name: str
    passed: bool
    message: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def load(cls, path: Path) -> CheckResult:
        return cls(**json.loads(Path(path).read_text()))


@dataclass
class Report:
    passed: bool
    checks: dict[str, CheckResult]
    overlap: dict[str, Any]
    created_at: str
    decontamination: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "passed": self.passed,
            "created_at": self.created_at,
            "checks": {n: {k: v for k, v in asdict(c).items() if k != "name"} for n, c in self.checks.items()},
            "overlap": self.overlap,
            "decontamination": self.decontamination,
        }

    def summary(self) -> str:
        lines = [f"preflight {'PASSED' if self.passed else 'FAILED'}"]
        lines += [f"  [{'ok' if c.passed else 'FAIL'}] {n}: {c.message}" for n, c in self.checks.items()]
        return "\n".join(lines)

    def markdown(self) -> str:
        rows = [f"| {n} | {'pass' if c.passed else '**FAIL**'} | {c.message} |" for n, c in self.checks.items()]
        pairs = self.overlap.get("pairs", [])[:20]
        out = [f"# Preflight: {'PASSED' if self.passed else 'FAILED'}", "", f"{self.created_at}", "",
               "| check | result | detail |", "|---|---|---|", *rows, ""]
        if pairs:
            out += ["## Train/val near-duplicates (first 20)", "", "| val | train | Jaccard |", "|---|---|---|",
                    *[f"| {p['val']} | {p['train']} | {p['jaccard']} |" for p in pairs], ""]
        if self.decontamination:
            out += [f"Decontaminated: dropped {len(self.decontamination['dropped'])} val document(s); "
                    f"clean manifest {self.decontamination['manifest']}", ""]
        return "\n".join(out)


def assemble(results: list[CheckResult], decontamination: dict[str, Any] | None = None) -> Report:
    overlap = next((r.details for r in results if r.name == "overlap"), {})
    return Report(
        passed=all(r.passed for r in results),
        checks={r.name: r for r in results},
        overlap={k: overlap[k] for k in ("contaminated_fraction", "pairs") if k in overlap},
        created_at=utc_now(),
        decontamination=decontamination,
    )
