"""The landing zone: where new training data arrives for ``taxiway_refresh``.

A batch is a folder ``<landing>/<batch_id>/`` holding ``train/``, optionally ``val/``, a
``manifest.jsonl`` (paths relative to the batch, sha256 per file) and the completion marker
``_COMPLETE``, written last and atomically. A batch without its marker is still being copied and is
never read; the marker records the manifest's sha256, so a manifest changed after landing is an
error naming the batch, not silently different data. The landing zone is a local path or an fsspec
URI (docs/refresh.md).
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath

from pipelines import manifest, storage
from pipelines.errors import BadInput
from trainer import fsio

MARKER = "_COMPLETE"
MANIFEST = "manifest.jsonl"
BATCH_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class LandingError(BadInput):
    """A batch that cannot be landed or read; the message names the batch and the reason."""


@dataclass(frozen=True)
class Batch:
    """A complete batch: its id, where it lies, and the sha256 of its manifest (its identity)."""

    id: str
    uri: str
    manifest_sha256: str
    files: int
    bytes: int
    landed_at: str

    @property
    def manifest(self) -> str:
        return f"{self.uri.rstrip('/')}/{MANIFEST}"

    def ref(self) -> dict[str, str]:
        """What the ledger records: id and manifest sha256."""
        return {"id": self.id, "manifest_sha256": self.manifest_sha256}


def _utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def check_batch_id(batch_id: str) -> str:
    if not BATCH_ID.match(batch_id):
        raise LandingError(f"batch id {batch_id!r}: use letters, digits, '.', '_' or '-' (at most 128, "
                           "not starting with a dot)")
    return batch_id


def land(src: str | Path, landing: str | Path, batch_id: str | None = None) -> Batch:
    """Copy the folder ``src`` (``train/`` and optionally ``val/``) into the landing zone as a batch:
    files first, then the manifest, then the marker. An interrupted copy leaves no marker, so no
    reader ever sees it; landing the same id again is refused."""
    source = Path(src)
    if not (source / "train").is_dir():
        raise LandingError(f"{source}: a batch needs a train/ folder (and may have val/)")
    extra = sorted(p.name for p in source.iterdir() if p.name not in ("train", "val", MANIFEST))
    if extra:
        raise LandingError(f"{source}: unexpected {', '.join(extra)} (a batch holds train/, val/ and manifest.jsonl)")
    files = [f for split in ("train", "val") if (source / split).is_dir()
             for f in sorted((source / split).rglob("*")) if f.is_file() or f.is_symlink()]
    if not files:
        raise LandingError(f"{source}: train/ holds no files")
    if batch_id is None:
        batch_id = f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}"
    check_batch_id(batch_id)
    zone = storage.locate(landing)
    target = zone.join(batch_id)
    if zone.fs.exists(target.join(MARKER).path):
        raise LandingError(f"{target.uri()}: batch {batch_id} already exists; land new data under a new id")
    if zone.fs.exists(target.path):
        raise LandingError(f"{target.uri()}: exists without its {MARKER} marker (an interrupted landing); "
                           "remove it or land under a new id")
    entries = [manifest.entry_for(source, f, f.relative_to(source).parts[0]) for f in files]
    if (source / MANIFEST).exists():
        _check_source_manifest(source / MANIFEST, entries)
    text = manifest.render(entries)
    if zone.local:
        _copy_local(source, Path(target.path), files, text)
    else:
        _copy_remote(source, target, files, text)
    marker = {"batch_id": batch_id, "manifest_sha256": hashlib.sha256(text.encode()).hexdigest(),
              "files": len(entries), "bytes": sum(e.bytes for e in entries), "landed_at": _utc_now()}
    _write(target.join(MARKER), json.dumps(marker, indent=1) + "\n")
    return _batch(target, marker)


def _check_source_manifest(path: Path, entries: list[manifest.Entry]) -> None:
    """A source that brings its own manifest must match its files: the first difference is named."""
    theirs = {e.path: e for e in manifest.read(path)}
    ours = {e.path: e for e in entries}
    for rel in sorted(theirs.keys() | ours.keys()):
        if rel not in ours:
            raise LandingError(f"{path}: lists {rel}, which is not in the folder")
        if rel not in theirs:
            raise LandingError(f"{path}: does not list {rel}")
        if (theirs[rel].split, theirs[rel].sha256) != (ours[rel].split, ours[rel].sha256):
            raise LandingError(f"{path}: {rel} differs from the file (split or sha256)")


def _copy_local(source: Path, target: Path, files: list[Path], manifest_text: str) -> None:
    """Into a hidden staging folder, renamed into place only when every file is there; a lander
    that lost a race for the same id is refused, not merged."""
    with fsio.staged_dir(target) as staging:
        for f in files:
            dest = staging / f.relative_to(source)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, dest)
        fsio.write_text(staging / MANIFEST, manifest_text)
    if (target / MANIFEST).read_text() != manifest_text:
        raise LandingError(f"{target}: another lander took batch id {target.name} meanwhile; land under a new id")


def _copy_remote(source: Path, target: storage.Location, files: list[Path], manifest_text: str) -> None:
    """Object stores have no rename of folders: files go straight in; the marker, written last,
    is what makes the batch exist for readers."""
    for f in files:
        target.fs.put_file(str(f), target.join(f.relative_to(source).as_posix()).path)
    _write(target.join(MANIFEST), manifest_text)


def _write(loc: storage.Location, text: str) -> None:
    if loc.local:
        fsio.write_text(Path(loc.path), text)
        return
    tmp = f"{loc.path}.{secrets.token_hex(4)}.tmp"
    loc.fs.pipe_file(tmp, text.encode())
    loc.fs.mv(tmp, loc.path)


def _batch(target: storage.Location, marker: dict) -> Batch:
    return Batch(id=marker["batch_id"], uri=target.uri(), manifest_sha256=marker["manifest_sha256"],
                 files=marker["files"], bytes=marker["bytes"], landed_at=marker["landed_at"])


def complete_batches(landing: str | Path) -> list[Batch]:
    """Every complete batch in the landing zone, oldest id first; folders without a marker (being
    copied) and hidden staging folders are not batches. A marker whose manifest no longer matches
    is an error naming the batch."""
    zone = storage.locate(landing)
    if not zone.fs.isdir(zone.path):
        return []
    batches = []
    for path in sorted(zone.fs.ls(zone.path, detail=False)):
        name = PurePosixPath(path).name
        if name.startswith(".") or not zone.fs.isfile(f"{path}/{MARKER}"):
            continue
        folder = storage.Location(zone.fs, path, zone.protocol)
        where = folder.join(MARKER).uri()
        try:
            marker = json.loads(storage.read_bytes(folder.join(MARKER)))
            if marker["batch_id"] != name:
                raise LandingError(f"{where}: marker names batch {marker['batch_id']!r}, folder is {name!r}")
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise LandingError(f"{where}: not a valid batch marker ({exc.__class__.__name__})") from None
        actual = storage.sha256(folder.join(MANIFEST))
        if actual != marker["manifest_sha256"]:
            raise LandingError(f"{folder.join(MANIFEST).uri()}: changed after landing (sha256 {actual[:12]}…, "
                               f"marker says {marker['manifest_sha256'][:12]}…); land changed data as a new batch")
        batches.append(_batch(folder, marker))
    return batches
