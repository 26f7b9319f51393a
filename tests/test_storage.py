"""Locations: a local path is located as fsspec would locate it, without importing fsspec (about
45 ms a process: a fresh CLI stage pays it); other URIs go through fsspec."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import REPO


@pytest.mark.parametrize("spelling", ["relative", "tilde", "file-uri", "dotdot"])
def test_a_local_path_is_the_path_fsspec_gives(spelling: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import fsspec
    from fsspec.implementations.local import LocalFileSystem

    from pipelines import storage

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "data").mkdir()
    uri = {"relative": "data/a.txt", "tilde": "~/data/a.txt", "file-uri": f"file://{tmp_path}/data/a.txt",
           "dotdot": f"{tmp_path}/data/../data/a.txt"}[spelling]
    loc = storage.locate(uri)
    _, expected = fsspec.core.url_to_fs(uri)
    assert (loc.path, loc.protocol, loc.local) == (str(Path(expected).resolve()), "file", True)
    assert loc.path == str(tmp_path / "data" / "a.txt")
    assert isinstance(loc.fs, LocalFileSystem) and isinstance(loc.join("b").fs, LocalFileSystem)


def test_other_uris_go_through_fsspec():
    from pipelines import storage

    loc = storage.locate("memory://corpus/a.txt")
    assert (loc.protocol, loc.local, loc.uri()) == ("memory", False, "memory://corpus/a.txt")
    assert type(loc.fs).__name__ == "MemoryFileSystem"


def test_reading_local_data_does_not_import_fsspec(tmp_path: Path):
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "a.txt").write_text("hello")
    code = (f"import sys; sys.path.insert(0, {str(REPO)!r}); from pipelines import storage\n"
            f"files = storage.list_files({str(tmp_path / 'train')!r})\n"
            "assert storage.read_bytes(files[0]) == b'hello' and storage.sha256(files[0])\n"
            "print('fsspec' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stdout


_SEGMENT = st.sampled_from(["a", "b.txt", ".hidden", "..", ".", "", "c.tar.gz", "d.", "é.JSONL", "x.Parquet"])


@settings(max_examples=400, deadline=None)
@given(root=st.lists(_SEGMENT, max_size=3), below=st.lists(_SEGMENT, max_size=4))
def test_relative_paths_and_suffixes_are_pathlibs(root: list[str], below: list[str]):
    """``storage.relative`` and ``documents.file_format`` cut strings instead of parsing paths
    (once per document on the overlap check's path); the oracle is pathlib, on paths with empty,
    dot, dot-dot and hidden segments, and paths that are not below the root."""
    from pathlib import PurePosixPath

    from pipelines import storage
    from pipelines.documents import FORMATS, DocumentError, file_format

    base = "/" + "/".join(root)
    for path in (base + "/" + "/".join(below), "/elsewhere/" + "/".join(below)):
        loc, top = storage.Location(None, path, "file"), storage.Location(None, base, "file")
        try:
            expected = PurePosixPath(path).relative_to(PurePosixPath(base)).as_posix()
        except ValueError:
            with pytest.raises(ValueError):
                storage.relative(loc, top)
        else:
            assert storage.relative(loc, top) == expected, (path, base)
        suffix = PurePosixPath(path).suffix.lower()
        if suffix in FORMATS:
            assert file_format(loc) == FORMATS[suffix], path
        else:
            with pytest.raises(DocumentError, match=f"extension '{suffix}'"):
                file_format(loc)
