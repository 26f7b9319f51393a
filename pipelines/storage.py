"""Reading data by local path or fsspec URI (``file://``, ``memory://``, ``s3://``, …).

A location is a (filesystem, path) pair. Local trees are walked without following directory
symlinks and every symlink is resolved strictly, so a symlink loop is an error naming the link
instead of an endless walk.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from pipelines.errors import BadInput
from trainer import fsio
from trainer.fsio import sha256_stream


class StorageError(BadInput):
    """A data location that cannot be read; the message names the path and the reason."""


@dataclass(frozen=True, slots=True)
class Location:
    filesystem: object | None  # fsspec AbstractFileSystem; None for a local path until ``fs`` is asked for
    path: str                  # path inside it (no protocol)
    protocol: str              # "file", "memory", ...

    @property
    def fs(self) -> object:
        """The fsspec filesystem. Local paths are read with ``os`` and get theirs only when asked:
        importing fsspec costs ~45 ms, 6% of the tokenize stage on the demo corpus."""
        if self.filesystem is None:
            from fsspec.implementations.local import LocalFileSystem  # fsspec (~45 ms): local reads go without it

            return LocalFileSystem()  # fsspec caches the instance
        return self.filesystem

    @property
    def local(self) -> bool:
        return self.protocol == "file"

    def join(self, rel: str) -> Location:
        return Location(self.filesystem, str(PurePosixPath(self.path) / rel), self.protocol)

    def uri(self) -> str:
        return self.path if self.local else f"{self.protocol}://{self.path.lstrip('/')}"


def locate(uri: str | Path) -> Location:
    text = str(uri)
    if "::" not in text and ("://" not in text or text.startswith("file://")):  # a plain local path
        return Location(None, str(Path(text.removeprefix("file://")).expanduser().resolve()), "file")
    import fsspec  # fsspec (~70 ms): local paths go without it (tests/test_storage.py)

    fs, path = fsspec.core.url_to_fs(text)
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    if protocol in ("file", "local"):
        return Location(fs, str(Path(path).resolve()), "file")
    return Location(fs, path, protocol)


def _walk_local(root: str) -> list[str]:
    files = []
    for folder, dirs, names in os.walk(root, followlinks=False):
        for name in [*dirs, *names]:
            full = os.path.join(folder, name)
            if os.path.islink(full):
                try:
                    target = Path(full).resolve(strict=True)
                except (RuntimeError, OSError) as exc:
                    raise StorageError(f"{full}: broken or looping symlink ({exc.__class__.__name__})") from None
                if target.is_dir():
                    raise StorageError(f"{full}: symlink to a directory is not followed; list its files instead")
        files += [os.path.join(folder, n) for n in names]
    return files


def list_files(spec: str | Path) -> list[Location]:
    """Files of a split: a folder (recursively) or a glob; sorted for determinism."""
    loc = locate(spec)
    if loc.local:
        if os.path.isdir(loc.path):
            paths = _walk_local(loc.path)
        else:
            paths = [p for p in glob.glob(loc.path, recursive=True) if os.path.isfile(p)]
        return [Location(loc.filesystem, str(Path(p).absolute()), "file") for p in sorted(paths)]
    fs = loc.fs
    paths = fs.find(loc.path) if fs.isdir(loc.path) else fs.glob(loc.path)
    return [Location(fs, p, loc.protocol) for p in sorted(paths) if fs.isfile(p)]


# Local files skip fsspec's per-call machinery: these run once per file on big corpora.

def size(loc: Location) -> int:
    return os.path.getsize(loc.path) if loc.local else int(loc.fs.size(loc.path))


def exists(loc: Location) -> bool:
    return os.path.isfile(loc.path) if loc.local else bool(loc.fs.isfile(loc.path))


def read_bytes(loc: Location) -> bytes:
    with (open(loc.path, "rb") if loc.local else loc.fs.open(loc.path, "rb")) as fh:
        return fh.read()


def sha256(loc: Location) -> str:
    """Streamed: constant memory whatever the file size. hashlib releases the GIL on large
    updates, so threads hash files in parallel."""
    with (open(loc.path, "rb", buffering=0) if loc.local else loc.fs.open(loc.path, "rb")) as fh:
        return sha256_stream(fh)


def relative(loc: Location, root: Location) -> str:
    """``loc``'s path below ``root``'s; ValueError when it is not below. A plain prefix cut where
    both paths are as pathlib would spell them (once per document on the overlap check's path),
    else pathlib's (tests/test_storage.py holds the two equal)."""
    if _plain(loc.path) and _plain(root.path):
        base = root.path if root.path.endswith("/") else root.path + "/"
        if loc.path.startswith(base) and len(loc.path) > len(base):
            return loc.path[len(base):]
    return PurePosixPath(loc.path).relative_to(PurePosixPath(root.path)).as_posix()


def _plain(path: str) -> bool:
    """No part pathlib would rewrite: doubled slashes, ``.`` segments, a trailing slash."""
    return (path not in ("", ".") and "//" not in path and "/./" not in path and not path.endswith("/.")
            and not path.startswith("./") and (path == "/" or not path.endswith("/")))


def write_text(loc: Location, text: str) -> str:
    """Atomically: a temp file beside it, then a rename (a move on other filesystems; on object
    stores that is one PUT of the whole object, atomic by itself). Returns the location's URI."""
    if loc.local:
        return str(fsio.write_text(loc.path, text))
    tmp = f"{loc.path}.{os.getpid()}.tmp"
    loc.fs.pipe_file(tmp, text.encode())
    loc.fs.mv(tmp, loc.path)
    return loc.uri()
