"""Member run folders: ``<run>/sweep/NN/``, each a normal run folder (its own ``config.yaml`` =
the run's config + its point) that reuses the parent run's preflight outcome and packed data, so
train, evaluate and register read it as they read any run folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipelines import stages
from pipelines.run_folder import RunFolder
from pipelines.sweep import points
from trainer import fsio


def member_key(run_key: str, index: int) -> str:
    """A member's run key (its MLflow run's identity, its gang's metrics): the sweep's, plus its index."""
    return f"{run_key}/sweep/{index:02d}"


def _shared_files(folder: RunFolder) -> list[Path]:
    """What the parent run's shared stages wrote that a member's later stages read."""
    for path, stage in ((folder.packed_link, "tokenize"), (folder.preflight_report, "preflight")):
        if not path.exists():
            raise stages.prepare.StageInputError(f"{path}: missing; the sweep's members need the '{stage}' stage first")
    return [p for p in (folder.packed_link, folder.preflight_report, folder.preflight_summary,
                        folder.overlap_plot, folder.effective_data) if p.exists()]


def read(run_dir: Path) -> list[dict[str, Any]]:
    """The members as ``write`` listed them."""
    path = RunFolder(run_dir).sweep_members
    if not path.exists():
        raise stages.prepare.StageInputError(f"{path}: missing; run the sweep's 'members' task first")
    return json.loads(path.read_text())


def member_dir(run_dir: Path, member: Any) -> Path:
    """The folder of the member ``member`` (an index, as a task's XCom names it) of the sweep in
    ``run_dir``: only an index ``write`` listed, so no value a task receives becomes a path."""
    listed = {int(m["member"]) for m in read(run_dir)}
    index = int(member) if isinstance(member, int | str) and str(member).isdigit() else None
    if index not in listed:
        raise stages.prepare.StageInputError(f"sweep member {str(member)[:20]!r}: not a member of this sweep")
    return RunFolder(run_dir).sweep_member(index)


def write(run_dir: Path, run_key: str) -> list[dict[str, Any]]:
    """One run folder per point (idempotent: a retry finds the same configs); returns each member as
    the XCom its tasks take: run folder, config sha256, name, run key, index and point."""
    parent = RunFolder(run_dir)
    shared = _shared_files(parent)
    out = []
    for m in points.read(run_dir, stages.prepare.load_run_config(run_dir)):
        member_dir = parent.sweep_member(m.index)
        stages.prepare.prepare(m.config, member_dir)
        for path in shared:
            fsio.write_bytes(member_dir / path.relative_to(parent.root), path.read_bytes())
        out.append({"run_dir": str(member_dir), "config_sha256": m.config.sha256(), "name": m.config.name,
                    "run_key": member_key(run_key, m.index), "member": f"{m.index:02d}", "point": m.point})
    fsio.write_json(parent.sweep_members, out)
    return out
