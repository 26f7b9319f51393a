"""Where the trainer writes: given to it in its spec, so the run folder's layout has one owner
(``pipelines/run_folder.py``) and the trainer never builds a path of its own."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class TrainerPaths:
    status: Path       # status.json, rewritten atomically (rank 0)
    metrics: Path      # metrics.jsonl, appended (rank 0)
    events: Path       # events.jsonl, appended (rank 0)
    checkpoints: Path  # step-NNNNNNNN/ folders
    export: Path       # the exported model folder
    scratch: Path      # stack dumps of a stalled rank, test hold markers

    def to_dict(self) -> dict[str, str]:
        return {k: str(v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> TrainerPaths:
        return cls(**{f.name: Path(raw[f.name]) for f in fields(cls)})
