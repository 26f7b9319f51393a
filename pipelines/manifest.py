"""The data manifest: one JSON object per file, ``{"path", "split", "bytes", "sha256"}``.

Paths are relative to the manifest's folder, so a dataset folder can move as a whole.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath

from pipelines import atomic

SPLITS = ("train", "val")
_CHUNK = 1 << 20


class ManifestError(ValueError):
    """A manifest that cannot be read; the message names the file and line."""


@dataclass(frozen=True)
class Entry:
    path: str
    split: str
    bytes: int
    sha256: str


def sha256_file(path: str | Path) -> str:
    """Streamed hash: constant memory whatever the file size."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def entry_for(root: Path, file: Path, split: str) -> Entry:
    return Entry(path=file.relative_to(root).as_posix(), split=split,
                 bytes=file.stat().st_size, sha256=sha256_file(file))


def scan(data_dir: str | Path) -> list[Entry]:
    """Entries for every file under ``data_dir/<split>/`` for each known split."""
    root = Path(data_dir).resolve()
    entries = []
    for split in SPLITS:
        folder = root / split
        if not folder.is_dir():
            raise ManifestError(f"{folder}: missing split folder '{split}'")
        entries += [entry_for(root, f, split) for f in sorted(folder.rglob("*")) if f.is_file()]
    return entries


def write(path: str | Path, entries: list[Entry]) -> Path:
    lines = "".join(json.dumps(asdict(e), sort_keys=False) + "\n" for e in entries)
    return atomic.write_text(path, lines)


def read(path: str | Path) -> list[Entry]:
    """Parse and validate every line; a bad line is an error naming file and line number."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ManifestError(f"{path}: manifest does not exist") from None
    except UnicodeDecodeError:
        raise ManifestError(f"{path}: manifest is not UTF-8 text") from None
    entries = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ManifestError(f"{where}: not valid JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise ManifestError(f"{where}: expected a JSON object")
        missing = {"path", "split", "bytes", "sha256"} - obj.keys()
        if missing:
            raise ManifestError(f"{where}: missing field(s) {', '.join(sorted(missing))}")
        rel = PurePosixPath(obj["path"])
        if rel.is_absolute() or ".." in rel.parts or not str(rel).strip():
            raise ManifestError(f"{where}: path {obj['path']!r} escapes the data root")
        if obj["split"] not in SPLITS:
            raise ManifestError(f"{where}: split {obj['split']!r} is not one of {', '.join(SPLITS)}")
        if not isinstance(obj["bytes"], int) or obj["bytes"] < 0:
            raise ManifestError(f"{where}: bytes must be a non-negative integer")
        if not isinstance(obj["sha256"], str) or len(obj["sha256"]) != 64:
            raise ManifestError(f"{where}: sha256 must be 64 hex characters")
        entries.append(Entry(str(rel), obj["split"], obj["bytes"], obj["sha256"].lower()))
    if not entries:
        raise ManifestError(f"{path}: manifest lists no files")
    return entries


def digest(path: str | Path) -> str:
    """sha256 of the manifest file itself: the dataset's identity in lineage."""
    return sha256_file(path)
