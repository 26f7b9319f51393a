"""The data manifest: one JSON object per file, ``{"path", "split", "bytes", "sha256"}``.

Paths are relative to the manifest's folder, so a dataset folder can move as a whole. The
manifest and the data may live on any fsspec filesystem.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath

from pipelines import storage
from pipelines.errors import BadInput
from pipelines.progress import Progress
from trainer.fsio import sha256_file

SPLITS = ("train", "val")


class ManifestError(BadInput):
    """A manifest that cannot be read; the message names the file and line."""


@dataclass(frozen=True, slots=True)
class Entry:
    path: str
    split: str
    bytes: int
    sha256: str


def hash_files(locs: list[storage.Location], workers: int | None = None,
               desc: str = "hashing") -> list[str]:
    """sha256 of every file, in order, on ``workers`` threads (hashlib drops the GIL)."""
    sizes = [storage.size(loc) for loc in locs]
    progress = Progress(sum(sizes), desc)

    def one(i: int) -> str:
        digest = storage.sha256(locs[i])
        progress.update(sizes[i])
        return digest

    with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1) as pool:
        out = list(pool.map(one, range(len(locs))))
    progress.close()
    return out


def scan(data_dir: str | Path, workers: int | None = None) -> list[Entry]:
    """Entries for every file under ``data_dir/<split>/`` for each known split."""
    root = storage.locate(data_dir)
    found: list[tuple[storage.Location, str]] = []
    for split in SPLITS:
        folder = root.join(split)
        if not root.fs.isdir(folder.path):
            raise ManifestError(f"{folder.uri()}: missing split folder '{split}'")
        found += [(loc, split) for loc in storage.list_files(folder.uri())]
    digests = hash_files([loc for loc, _ in found], workers)
    return [Entry(storage.relative(loc, root), split, storage.size(loc), digest)
            for (loc, split), digest in zip(found, digests, strict=True)]


def entry_for(root: Path, file: Path, split: str) -> Entry:
    return Entry(path=file.relative_to(root).as_posix(), split=split,
                 bytes=file.stat().st_size, sha256=sha256_file(file))


def render(entries: Iterable[Entry]) -> str:
    return "".join(json.dumps(asdict(e)) + "\n" for e in entries)


def write(path: str | Path, entries: list[Entry]) -> str:
    return storage.write_text(storage.locate(path), render(entries))


def parse_line(line: str, where: str) -> Entry:
    """One manifest line, validated; errors name ``file:line`` and the field."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ManifestError(f"{where}: not valid JSON ({exc.msg})") from None
    if not isinstance(obj, dict):
        raise ManifestError(f"{where}: expected a JSON object")
    missing = {"path", "split", "bytes", "sha256"} - obj.keys()
    if missing:
        raise ManifestError(f"{where}: missing field(s) {', '.join(sorted(missing))}")
    if not isinstance(obj["path"], str) or not obj["path"].strip():
        raise ManifestError(f"{where}: path must be a non-empty string")
    rel = PurePosixPath(obj["path"])
    if rel.is_absolute() or ".." in rel.parts or obj["path"].startswith(("/", "\\")) or ":" in rel.parts[0]:
        raise ManifestError(f"{where}: path {obj['path']!r} escapes the data root (must be relative, no '..')")
    if obj["split"] not in SPLITS:
        raise ManifestError(f"{where}: split {obj['split']!r} is not one of {', '.join(SPLITS)}")
    if not isinstance(obj["bytes"], int) or isinstance(obj["bytes"], bool) or obj["bytes"] < 0:
        raise ManifestError(f"{where}: bytes must be a non-negative integer")
    digest = obj["sha256"]
    if not isinstance(digest, str) or len(digest) != 64 or any(c not in "0123456789abcdefABCDEF" for c in digest):
        raise ManifestError(f"{where}: sha256 must be 64 hex characters")
    return Entry(str(rel), obj["split"], obj["bytes"], digest.lower())


def read(path: str | Path) -> list[Entry]:
    """Parse and validate every line; a bad line is an error naming file and line number."""
    loc = storage.locate(path)
    try:
        text = storage.read_bytes(loc).decode("utf-8")
    except FileNotFoundError:
        raise ManifestError(f"{path}: manifest does not exist") from None
    except UnicodeDecodeError:
        raise ManifestError(f"{path}: manifest is not UTF-8 text") from None
    entries, seen = [], set()
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.strip():
            entry = parse_line(line, f"{path}:{lineno}")
            if entry.path in seen:
                raise ManifestError(f"{path}:{lineno}: path {entry.path!r} listed twice")
            seen.add(entry.path)
            entries.append(entry)
    if not entries:
        raise ManifestError(f"{path}: manifest lists no files")
    return entries


def digest(path: str | Path) -> str:
    """sha256 of the manifest file itself: the dataset's identity in lineage."""
    return storage.sha256(storage.locate(path))


def root_of(path: str | Path) -> storage.Location:
    """The folder manifest paths are relative to."""
    loc = storage.locate(path)
    return storage.Location(loc.filesystem, str(PurePosixPath(loc.path).parent), loc.protocol)

