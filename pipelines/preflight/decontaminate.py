"""``preflight.action: decontaminate``: drop contaminated val documents and go on with the rest.

Writes ``<run>/preflight/clean/``: the val files without the dropped documents (txt files left
out, jsonl lines and parquet rows filtered), file symlinks to the untouched train files, a
``manifest.jsonl`` for the whole clean dataset, and ``dropped.json``. Later stages read the
data through ``effective.json`` (see ``effective_data``).
"""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path, PurePosixPath

from pipelines import manifest, storage
from pipelines.config import RunConfig
from pipelines.documents import file_format, records, split_files
from pipelines.errors import BadInput, CheckFailed
from pipelines.preflight.overlap import file_key, record_key
from pipelines.run_folder import RunFolder
from trainer import fsio


def filtered(loc: storage.Location, fmt: str, drop: set[str], root: storage.Location) -> tuple[bytes | None, int]:
    """The file's bytes without the dropped documents (None: nothing left), and how many dropped."""
    recs = list(records(loc, fmt))
    fkey = file_key(loc, root)
    gone = [r for r in recs if record_key(r, fkey) in drop]
    if not gone:
        return storage.read_bytes(loc), 0
    if len(gone) == len(recs):
        return None, len(gone)
    if fmt == "jsonl":
        dropped_lines = {int(r.doc_id.rsplit("#", 1)[1]) for r in gone}
        lines = storage.read_bytes(loc).splitlines(keepends=True)
        return b"".join(line for i, line in enumerate(lines, 1) if i not in dropped_lines), len(gone)
    if fmt == "parquet":
        import pyarrow as pa  # pyarrow (~0.1 s): only parquet data needs it; DAG parse must not pay
        import pyarrow.parquet as pq  # pyarrow (~0.1 s): only parquet data needs it; DAG parse must not pay

        table = pq.read_table(io.BytesIO(storage.read_bytes(loc)))
        dropped_rows = {int(r.doc_id.rsplit("#", 1)[1]) for r in gone}
        keep = pa.array([i not in dropped_rows for i in range(table.num_rows)])
        buf = io.BytesIO()
        pq.write_table(table.filter(keep), buf)
        return buf.getvalue(), len(gone)
    raise AssertionError(f"one-document format {fmt} cannot be partly dropped")


def decontaminate(cfg: RunConfig, run_dir: Path, drop: set[str]) -> dict:
    root = manifest.root_of(cfg.data.manifest)
    val_root = storage.locate(cfg.data.val)
    if not root.local or not os.path.isdir(val_root.path):
        raise BadInput("preflight.action=decontaminate needs local data with data.val a folder "
                         f"(got data.val={cfg.data.val!r})")
    try:
        val_rel = storage.relative(val_root, root)
    except ValueError:
        raise BadInput(f"data.val {cfg.data.val} is not under the manifest's folder {root.path}") from None
    final = RunFolder(run_dir).clean_data
    shutil.rmtree(final, ignore_errors=True)
    entries, dropped = [], []
    with fsio.staged_dir(final) as stage:
        for e in manifest.read(cfg.data.manifest):
            if e.split == "train":
                link = stage / e.path
                link.parent.mkdir(parents=True, exist_ok=True)
                os.symlink(root.join(e.path).path, link)
                entries.append(e)
        for loc in split_files(cfg.data.val):
            rel = storage.relative(loc, root)
            data, n = filtered(loc, file_format(loc, cfg.data.format), drop, root)
            if n:
                dropped.append({"file": rel, "documents": n})
            if data is None:
                continue
            fsio.write_bytes(stage / rel, data)
            entries.append(manifest.Entry(rel, "val", len(data), fsio.sha256_file(stage / rel)))
        manifest.write(stage / "manifest.jsonl", entries)
        fsio.write_json(stage / "dropped.json", {"documents": sorted(drop), "files": dropped})
    if not any(e.split == "val" for e in entries):
        raise CheckFailed("decontamination would leave the val split empty")
    effective = {"val": str(final / PurePosixPath(val_rel)), "manifest": str(final / "manifest.jsonl"),
                 "dropped_documents": len(drop)}
    fsio.write_json(RunFolder(run_dir).effective_data, effective)
    return effective


def effective_data(cfg: RunConfig, run_dir: Path) -> RunConfig:
    """The config later stages use: the decontaminated val split when there is one."""
    path = RunFolder(run_dir).effective_data
    if not path.exists():
        return cfg
    eff = json.loads(path.read_text())
    return cfg.model_copy(update={"data": cfg.data.model_copy(update={"val": eff["val"], "manifest": eff["manifest"]})})
