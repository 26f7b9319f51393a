"""File I/O every layer shares, at the bottom layer so the trainer needs nothing above it:
atomic writes (a reader sees the old file, the new file, or nothing, never half of one), staged
folders renamed into place, streamed sha256, and UTC timestamps."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

_CHUNK = 1 << 20


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def write_bytes(path: str | Path, data: bytes, durable: bool = True) -> Path:
    """Temp file beside ``path``, then rename. ``durable=False`` skips the fsync: for files rewritten
    every few seconds (status.json), where surviving a host crash does not matter and an fsync per
    heartbeat would cost the training loop."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


def write_text(path: str | Path, text: str, durable: bool = True) -> Path:
    return write_bytes(path, text.encode(), durable)


def write_json(path: str | Path, obj: Any, durable: bool = True) -> Path:
    return write_text(path, json.dumps(obj, indent=2) + "\n", durable)


@contextlib.contextmanager
def staged_dir(final: str | Path) -> Iterator[Path]:
    """Yield a temp folder beside ``final``; on success rename it into place, else remove it.

    If ``final`` appeared meanwhile (another process won the race), the staged copy is dropped:
    content-addressed outputs are identical, so the first one stays.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    try:
        yield tmp
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.is_dir():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def sha256_stream(fh: BinaryIO) -> str:
    """Streamed: constant memory whatever the size. hashlib releases the GIL on large updates, so
    threads hash files in parallel."""
    digest = hashlib.sha256()
    while chunk := fh.read(_CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


def sha256_file(path: str | Path) -> str:
    with open(path, "rb", buffering=0) as fh:
        return sha256_stream(fh)
