"""Check that the files on disk are exactly the files the manifest promises."""

from __future__ import annotations

from pathlib import Path

from pipelines import manifest
from pipelines.config import RunConfig
from pipelines.documents import split_files
from pipelines.preflight.report import CheckResult

_MAX_LISTED = 20  # problems named in the message; all of them go to details


def check_manifest(cfg: RunConfig) -> CheckResult:
    """Counts per split, presence, unlisted files, byte sizes and sha256 of every file."""
    manifest_path = Path(cfg.data.manifest).resolve()
    entries = manifest.read(manifest_path)  # unreadable manifest: bad input, raised
    root = manifest_path.parent
    problems: list[str] = []
    counts = {}
    for split in manifest.SPLITS:
        listed = {(root / e.path).resolve(): e for e in entries if e.split == split}
        on_disk = set(split_files(getattr(cfg.data, split)))
        counts[split] = {"listed": len(listed), "on_disk": len(on_disk)}
        if not listed:
            problems.append(f"split '{split}' lists no files")
        for path, entry in sorted(listed.items()):
            if not path.is_file():
                problems.append(f"{entry.path}: listed in the manifest but missing")
            elif path not in on_disk:
                problems.append(f"{entry.path}: listed as '{split}' but not under data.{split}")
            elif path.stat().st_size != entry.bytes:
                problems.append(f"{entry.path}: size {path.stat().st_size} != manifest {entry.bytes}")
            elif manifest.sha256_file(path) != entry.sha256:
                problems.append(f"{entry.path}: sha256 differs from the manifest")
        if not cfg.preflight.allow_unlisted:
            for path in sorted(on_disk - listed.keys()):
                problems.append(f"{path}: present under data.{split} but not in the manifest")
    message = (f"{sum(c['listed'] for c in counts.values())} files match the manifest"
               if not problems else f"{len(problems)} problem(s): " + "; ".join(problems[:_MAX_LISTED]))
    return CheckResult("manifest", not problems, message,
                       {"manifest": str(manifest_path), "sha256": manifest.digest(manifest_path),
                        "counts": counts, "problems": problems})
