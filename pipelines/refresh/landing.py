"""The landing zone: where new training data arrives for ``taxiway_refresh``.

A batch is a folder ``<landing>/<batch_id>/`` holding ``train/``, optionally ``val/``, a
``manifest.jsonl`` (paths relative to the batch, sha256 per file) and the completion marker
``_COMPLETE``, written last and atomically. A batch without its marker is still being copied and is
never read; the marker records the manifest's sha256, so a manifest changed after landing is an
error naming the batch, not silently different data. In a local zone the marker is written inside
a hidden staging folder and one rename puts the batch in place, so a lander killed on its way never
leaves its id taken. A batch is regular files in real folders: a symlink, fifo, socket or device
would have the lander copy what the folder does not hold (``/proc/self/environ``), so each is named
and nothing lands. So is every file the pipeline could not read as documents (its format, its
encoding, a JSON line without a string ``text``): a batch that lands can be trained on, and one that
cannot never lands to fail a refresh later. The landing zone is a local path or an fsspec URI
(docs/refresh.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import stat
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from pipelines import documents, manifest, storage
from pipelines.config.limits import LimitsConfig
from pipelines.errors import BadInput
from trainer import fsio

MARKER = "_COMPLETE"
MANIFEST = "manifest.jsonl"
BATCH_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
ASSET_NAME = "taxiway_landing"  # the landing zone as an Airflow asset (taxiway_refresh is scheduled on it)
_MARKER_FIELDS = {"batch_id": str, "manifest_sha256": str, "files": int, "bytes": int, "landed_at": str}
_KINDS = ((stat.S_ISLNK, "a symlink"), (stat.S_ISFIFO, "a fifo"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"), (stat.S_ISDIR, "a folder"),
          (stat.S_ISREG, "a file, not a folder"))  # what an entry is, where it may not be
_SHOWN = 20       # refused entries named in one error at most
_CHUNK = 1 << 20  # bytes per read while copying


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


def asset_uri(landing: str | Path) -> str:
    """The landing zone's asset URI: a local path as ``file://``, an fsspec URI as it is."""
    return str(landing) if "://" in str(landing) else Path(landing).resolve().as_uri()


def check_batch_id(batch_id: str) -> str:
    if not BATCH_ID.fullmatch(batch_id):
        raise LandingError(f"batch id {batch_id!r}: use letters, digits, '.', '_' or '-' (at most 128, "
                           "not starting with a dot)")
    return batch_id


def land(src: str | Path, landing: str | Path, batch_id: str | None = None, fmt: str | None = None,
         limits: LimitsConfig | None = None) -> Batch:
    """Copy the folder ``src`` (``train/`` and optionally ``val/``) into the landing zone as a batch:
    files first, then the manifest, then the marker. An interrupted copy leaves no marker, so no
    reader ever sees it; a source holding links or special files, files the pipeline cannot read as
    documents (``fmt``: the deployment's ``data.format``, else each file's extension), more files or
    bytes than ``limits`` allow a batch (the deployment's; default ``LimitsConfig()``), a zone already
    holding ``limits.batches`` batches, or an id that exists, is refused."""
    limits = limits or LimitsConfig()
    source = Path(src)
    if not (source / "train").is_dir():
        raise LandingError(f"{source}: a batch needs a train/ folder (and may have val/)")
    extra = sorted(p.name for p in source.iterdir() if p.name not in ("train", "val", MANIFEST))
    if extra:
        raise LandingError(f"{source}: unexpected {', '.join(extra)} (a batch holds train/, val/ and manifest.jsonl)")
    rels = _regular_files(source)
    if not any(rel.parts[0] == "train" for rel in rels):
        raise LandingError(f"{source}: train/ holds no files")
    if len(rels) > limits.batch_files:
        raise LandingError(f"{source}: {len(rels)} files, over limits.batch_files ({limits.batch_files}); nothing landed")
    if (size := sum(os.lstat(source / rel).st_size for rel in rels)) > limits.batch_bytes:
        raise LandingError(f"{source}: {size} bytes, over limits.batch_bytes ({limits.batch_bytes}); nothing landed")
    if (held := len(scan(landing)[0])) >= limits.batches:
        raise LandingError(f"{landing}: holds {held} batches, limits.batches ({limits.batches}); remove trained "
                           "batches before landing more")
    _refuse(source, unreadable(source, rels, fmt),
            "every file must read as documents (.txt in UTF-8, .jsonl lines with a string 'text', .parquet with a "
            "'text' column; or set data.format)")
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
    put = _land_local if zone.local else _land_remote
    return _batch(target, put(source.resolve(), target, rels, batch_id))


def _regular_files(source: Path) -> list[Path]:
    """The batch's files, relative to ``source``, in the order ``storage.list_files`` gives (the
    manifest's bytes stay what they were); before anything is copied, every entry that is no regular
    file in a real folder (``train/`` itself included) is named with what it is."""
    files, refused = [], []
    pending = [Path(split) for split in ("train", "val") if os.path.lexists(source / split)]
    if os.path.lexists(source / MANIFEST) and not stat.S_ISREG(mode := os.lstat(source / MANIFEST).st_mode):
        refused.append((Path(MANIFEST), mode))
    while pending:
        rel = pending.pop()
        mode = os.lstat(source / rel).st_mode
        if stat.S_ISDIR(mode):
            pending += [rel / name for name in os.listdir(source / rel)]
        elif stat.S_ISREG(mode) and len(rel.parts) > 1:
            files.append(rel)
        else:
            refused.append((rel, mode))
    _refuse(source, [(rel, _kind(mode)) for rel, mode in refused],
            "a batch holds regular files in real folders (no symlinks, fifos, sockets or devices)")
    return sorted(files, key=Path.as_posix)


def unreadable(source: Path, rels: list[Path], fmt: str | None = None) -> list[tuple[Path, str]]:
    """The files of ``rels`` (under ``source``) that the pipeline could not read as documents, each with
    its first problem, as the preflight and the tokenizer would meet it."""
    return [(rel, why) for rel in rels if (why := _problem(storage.locate(str(source / rel)), fmt))]


def unreadable_batch(batch: Batch, fmt: str | None = None) -> str | None:
    """Why a landed batch cannot be trained on (its unreadable files, each named), or None: the door's
    check for a batch another system landed."""
    root = storage.locate(batch.uri)
    try:
        entries = manifest.read(batch.manifest)
    except manifest.ManifestError as exc:
        return str(exc)
    found = [(e.path, why) for e in entries if (why := _problem(root.join(e.path), fmt))]
    return f"unreadable {_named(found)}" if found else None


def _problem(loc: storage.Location, fmt: str | None) -> str | None:
    try:
        return next((r.problem for r in documents.records(loc, fmt) if r.problem), None)
    except documents.DocumentError as exc:
        return str(exc).removeprefix(f"{loc.uri()}: ")


def _refuse(source: Path, refused: list[tuple[Path, str]], rule: str) -> None:
    """Refuse the batch naming each entry (at most ``_SHOWN``) and why, and the rule it breaks."""
    if refused:
        raise LandingError(f"{source}: refused {_named([(rel.as_posix(), why) for rel, why in refused])}: {rule}; "
                           "nothing landed")


def _named(found: list[tuple[str, str]]) -> str:
    """``path (why), …`` for at most ``_SHOWN`` entries, in path order, and how many more there are."""
    shown = ", ".join(f"{path} ({why})" for path, why in sorted(found)[:_SHOWN])
    return shown + (f" and {len(found) - _SHOWN} more" if len(found) > _SHOWN else "")


def _kind(mode: int) -> str:
    return next((what for test, what in _KINDS if test(mode)), "a special file")


def _open_source(source: Path, rel: Path) -> BinaryIO:
    """``source/rel`` opened without following a link at any level (each folder opened inside the
    last): an entry swapped for a link after ``_regular_files`` looked cannot lead the copy out."""
    folder = os.open(source, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in rel.parts[:-1]:
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=folder)
            os.close(folder)
            folder = inner
        fd = os.open(rel.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
    except OSError as exc:
        raise LandingError(f"{source}: {rel.as_posix()} changed while landing ({exc.strerror})") from None
    finally:
        os.close(folder)
    fh = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        fh.close()
        raise LandingError(f"{source}: {rel.as_posix()} changed while landing (no longer a regular file)")
    return fh


def _marker(batch_id: str, entries: list[manifest.Entry]) -> dict:
    return {"batch_id": batch_id, "manifest_sha256": hashlib.sha256(manifest.render(entries).encode()).hexdigest(),
            "files": len(entries), "bytes": sum(e.bytes for e in entries),
            "landed_at": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")}


def _render(marker: dict) -> str:
    return json.dumps(marker, indent=1) + "\n"


def _land_local(source: Path, target: storage.Location, rels: list[Path], batch_id: str) -> dict:
    """Into a hidden staging folder: each file copied, synced and hashed as copied (the manifest
    describes what landed, not what the source held a moment before), the manifest, the marker, then
    one rename into place, the commit: a lander killed before it leaves only its staging folder,
    which is no batch, and the id free. A lander that lost a race for the id leaves the winner's
    folder untouched."""
    with fsio.staged_dir(Path(target.path)) as staging:
        for rel in rels:
            dest = staging / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            with _open_source(source, rel) as fh, open(dest, "wb") as out:
                shutil.copyfileobj(fh, out, _CHUNK)
                out.flush()
                os.fsync(out.fileno())
        entries = _checked(source, [manifest.entry_for(staging, staging / rel, rel.parts[0]) for rel in rels])
        fsio.write_text(staging / MANIFEST, manifest.render(entries))
        marker = _marker(batch_id, entries)
        fsio.write_text(staging / MARKER, _render(marker))
    try:
        landed = storage.read_bytes(target.join(MARKER)).decode()
    except (OSError, UnicodeDecodeError):
        landed = None
    if landed != _render(marker):
        raise LandingError(f"{target.uri()}: another lander wrote batch {batch_id} meanwhile; land under a new id")
    return marker


def _land_remote(source: Path, target: storage.Location, rels: list[Path], batch_id: str) -> dict:
    """Object stores have no folder rename: files go straight in, then the manifest; the marker,
    written last, is what makes the batch exist for readers. Two landers of one id are not
    serialised here (the default id is unique); the manifest read back before the marker catches
    most collisions."""
    for rel in rels:
        dest = target.join(rel.as_posix()).path
        target.fs.mkdirs(str(PurePosixPath(dest).parent), exist_ok=True)
        with _open_source(source, rel) as fh, target.fs.open(dest, "wb") as out:
            shutil.copyfileobj(fh, out, _CHUNK)
    entries = _checked(source, [manifest.Entry(rel.as_posix(), rel.parts[0], storage.size(loc), storage.sha256(loc))
                                for rel in rels for loc in [target.join(rel.as_posix())]])
    text = manifest.render(entries)
    storage.write_text(target.join(MANIFEST), text)
    if storage.read_bytes(target.join(MANIFEST)).decode() != text:
        raise LandingError(f"{target.uri()}: another lander wrote batch {batch_id} meanwhile; land under a new id")
    marker = _marker(batch_id, entries)
    storage.write_text(target.join(MARKER), _render(marker))
    return marker


def _checked(source: Path, entries: list[manifest.Entry]) -> list[manifest.Entry]:
    if (source / MANIFEST).exists():
        _check_source_manifest(source / MANIFEST, entries)
    return entries


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


def _batch(target: storage.Location, marker: dict) -> Batch:
    return Batch(id=marker["batch_id"], uri=target.uri(), manifest_sha256=marker["manifest_sha256"],
                 files=marker["files"], bytes=marker["bytes"], landed_at=marker["landed_at"])


def _read_marker(folder: storage.Location, name: str) -> dict:
    where = folder.join(MARKER).uri()
    try:
        marker = json.loads(storage.read_bytes(folder.join(MARKER)).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise LandingError(f"{where}: not a JSON batch marker") from None
    if not isinstance(marker, dict):
        raise LandingError(f"{where}: not a JSON batch marker")
    for field, kind in _MARKER_FIELDS.items():
        if not isinstance(marker.get(field), kind) or isinstance(marker.get(field), bool):
            raise LandingError(f"{where}: field {field} missing or not a {kind.__name__}")
    if marker["batch_id"] != name:
        raise LandingError(f"{where}: marker names batch {marker['batch_id']!r}, folder is {name!r}")
    return marker


def scan(landing: str | Path) -> tuple[list[Batch], list[tuple[str, str]]]:
    """Every complete batch in the landing zone, in landing order (``landed_at``, then id), and the
    invalid ones as (folder name, reason): a bad marker or id, a missing manifest, or a manifest that
    no longer matches its marker. Folders without a marker (being copied) and hidden staging folders
    are not batches."""
    zone = storage.locate(landing)
    if not zone.fs.isdir(zone.path):
        return [], []
    batches, invalid = [], []
    for path in zone.fs.ls(zone.path, detail=False):
        name = PurePosixPath(path).name
        if name.startswith(".") or not zone.fs.isfile(f"{path}/{MARKER}"):
            continue
        try:
            batches.append(_checked_batch(storage.Location(zone.fs, path, zone.protocol), name))
        except LandingError as exc:
            invalid.append((name, str(exc)))
    return sorted(batches, key=lambda b: (b.landed_at, b.id)), sorted(invalid)


def _checked_batch(folder: storage.Location, name: str) -> Batch:
    check_batch_id(name)
    marker = _read_marker(folder, name)
    try:
        actual = storage.sha256(folder.join(MANIFEST))
    except FileNotFoundError:
        raise LandingError(f"{folder.uri()}: complete (marker present) but {MANIFEST} is missing") from None
    if actual != marker["manifest_sha256"]:
        raise LandingError(f"{folder.join(MANIFEST).uri()}: changed after landing (sha256 {actual[:12]}…, "
                           f"marker says {marker['manifest_sha256'][:12]}…); land changed data as a new batch")
    return _batch(folder, marker)


def complete_batches(landing: str | Path) -> list[Batch]:
    """``scan``'s batches; an invalid one is an error naming it."""
    batches, invalid = scan(landing)
    if invalid:
        raise LandingError(invalid[0][1])
    return batches
