"""Small file helpers the trainer needs without depending on the orchestration code."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def write_text_atomic(path: Path, text: str, durable: bool = True) -> None:
    """Readers see the old or the new file, never half of one. ``durable=False`` skips the fsync:
    for files rewritten every few seconds (status.json), where surviving a host crash does not
    matter and an fsync per heartbeat would cost the training loop."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
        if durable:
            fh.flush()
            os.fsync(fh.fileno())
    os.replace(tmp, path)


def write_json_atomic(path: Path, obj: Any, durable: bool = True) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2), durable)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
