"""Reading documents from data files: ``.txt`` (one per file), ``.jsonl`` (field ``text``),
``.parquet`` (column ``text``). Every error names the file and, where it has one, the line."""

from __future__ import annotations

import glob
import json
from collections.abc import Iterator
from pathlib import Path

FORMATS = {".txt": "txt", ".jsonl": "jsonl", ".parquet": "parquet"}


class DocumentError(ValueError):
    """A data file that cannot be read as documents."""


def split_files(spec: str) -> list[Path]:
    """Files of a split: a folder (recursively) or a glob, sorted for determinism."""
    path = Path(spec)
    if path.is_dir():
        files = [p for p in path.rglob("*") if p.is_file()]
    else:
        files = [Path(p) for p in glob.glob(spec, recursive=True) if Path(p).is_file()]
    return sorted(f.resolve() for f in files)


def file_format(path: Path, declared: str | None = None) -> str:
    if declared:
        return declared
    try:
        return FORMATS[path.suffix.lower()]
    except KeyError:
        raise DocumentError(
            f"{path}: cannot infer format from extension '{path.suffix}' "
            f"(expected one of {', '.join(FORMATS)}; or set data.format)") from None


def read_documents(path: Path, fmt: str | None = None) -> Iterator[tuple[str, str]]:
    """Yield ``(doc_id, text)``; doc ids are ``file`` or ``file#line``/``file#row``."""
    fmt = file_format(path, fmt)
    if fmt == "txt":
        yield str(path), _decode(path, path.read_bytes())
    elif fmt == "jsonl":
        with open(path, "rb") as fh:
            for lineno, raw in enumerate(fh, 1):
                if not raw.strip():
                    continue
                line = _decode(path, raw, lineno)
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DocumentError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
                if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
                    raise DocumentError(f"{path}:{lineno}: no string field 'text'")
                yield f"{path}#{lineno}", obj["text"]
    elif fmt == "parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        if "text" not in table.column_names:
            raise DocumentError(f"{path}: parquet file has no column 'text'")
        for row, text in enumerate(table.column("text").to_pylist()):
            yield f"{path}#{row}", text or ""
    else:
        raise DocumentError(f"{path}: unknown format {fmt!r}")


def _decode(path: Path, raw: bytes, lineno: int | None = None) -> str:
    where = f"{path}:{lineno}" if lineno else str(path)
    if b"\x00" in raw:
        raise DocumentError(f"{where}: binary content (NUL bytes)")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DocumentError(f"{where}: invalid UTF-8 at byte {exc.start}") from None
