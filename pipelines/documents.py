"""Reading documents from data files: ``.txt`` (one per file), ``.jsonl`` (field ``text``),
``.parquet`` (column ``text``), by local path or fsspec URI.

``records`` never stops at a bad document: it reports the problem on the record, so the
preflight checks can name every bad file at once. ``read_documents`` is the strict reader for
later stages: the first problem is an error naming the file (and line).
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass

from pipelines import storage
from pipelines.errors import BadInput

FORMATS = {".txt": "txt", ".jsonl": "jsonl", ".parquet": "parquet"}


class DocumentError(BadInput):
    """A data file that cannot be read as documents."""


@dataclass(frozen=True)
class Record:
    doc_id: str             # file uri, or file#line (jsonl, 1-based) / file#row (parquet, 0-based)
    file: str
    text: str | None        # None when the document could not be read
    n_bytes: int
    problem: str | None = None


def split_files(spec: str) -> list[storage.Location]:
    """Files of a split: a folder (recursively) or a glob, sorted for determinism."""
    return storage.list_files(spec)


def file_format(loc: storage.Location, declared: str | None = None) -> str:
    if declared:
        return declared
    name = next((part for part in reversed(loc.path.split("/")) if part not in ("", ".")), "")
    dot = name.rfind(".")
    suffix = name[dot:].lower() if 0 < dot < len(name) - 1 else ""  # PurePosixPath.suffix, without its parse
    try:
        return FORMATS[suffix]
    except KeyError:
        raise DocumentError(
            f"{loc.uri()}: cannot infer format from extension '{suffix}' "
            f"(expected one of {', '.join(FORMATS)}; or set data.format)") from None


def _decode(raw: bytes) -> tuple[str | None, str | None]:
    if b"\x00" in raw:
        return None, "binary content (NUL bytes)"
    try:
        return raw.decode("utf-8"), None
    except UnicodeDecodeError as exc:
        return None, f"invalid UTF-8 at byte {exc.start}"


def records(loc: storage.Location, fmt: str | None = None) -> Iterator[Record]:
    return parse(storage.read_bytes(loc), loc, fmt)


def parse(raw: bytes, loc: storage.Location, fmt: str | None = None) -> Iterator[Record]:
    """The documents of ``loc`` from its bytes ``raw``, already read (preflight reads each file
    once for its hash and every check)."""
    fmt = file_format(loc, fmt)
    uri = loc.uri()
    if fmt == "txt":
        text, problem = _decode(raw)
        yield Record(uri, uri, text, len(raw), problem)
    elif fmt == "jsonl":
        for lineno, line in enumerate(raw.splitlines(), 1):
            if not line.strip():
                continue
            doc_id = f"{uri}#{lineno}"
            text, problem = _decode(line)
            if text is not None:
                try:
                    obj = json.loads(text)
                except json.JSONDecodeError as exc:
                    text, problem = None, f"not valid JSON ({exc.msg})"
                else:
                    if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
                        text, problem = None, "no string field 'text'"
                    else:
                        text = obj["text"]
            yield Record(doc_id, uri, text, len(line), problem)
    elif fmt == "parquet":
        import pyarrow.parquet as pq  # pyarrow (~0.1 s): only parquet data needs it; DAG parse must not pay

        try:
            table = pq.read_table(io.BytesIO(raw))
        except Exception as exc:  # pyarrow raises several unrelated types for a broken file
            yield Record(uri, uri, None, len(raw), f"not a readable parquet file ({exc.__class__.__name__})")
            return
        if "text" not in table.column_names:
            yield Record(uri, uri, None, len(raw), "parquet file has no column 'text'")
            return
        for row, text in enumerate(table.column("text").to_pylist()):
            problem = None if isinstance(text, str) else "null or non-string 'text'"
            yield Record(f"{uri}#{row}", uri, text if problem is None else None,
                         len(text.encode()) if problem is None else 0, problem)
    else:
        raise DocumentError(f"{uri}: unknown format {fmt!r}")


def read_documents(loc: storage.Location, fmt: str | None = None,
                   sha256: str | None = None) -> Iterator[tuple[str, str]]:
    """``(doc_id, text)`` pairs; the first unreadable document is an error naming it. With
    ``sha256`` (the manifest's), a file whose bytes hash otherwise is an error too: whatever is
    cached under a key made of manifest hashes must be made of the content they name, even when it
    is read before the preflight gate has checked the files."""
    raw = storage.read_bytes(loc)
    if sha256 is not None and (actual := hashlib.sha256(raw).hexdigest()) != sha256:
        raise DocumentError(f"{loc.uri()}: content differs from the manifest (sha256 {actual[:12]}…, manifest "
                            f"{sha256[:12]}…); rebuild the manifest if the change is intended")
    for rec in parse(raw, loc, fmt):
        if rec.problem:
            raise DocumentError(f"{rec.doc_id}: {rec.problem}")
        yield rec.doc_id, rec.text
