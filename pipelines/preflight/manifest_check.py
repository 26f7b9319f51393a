"""Check that the files in the data folders are exactly the files the manifest promises."""

from __future__ import annotations

from pipelines import manifest, storage
from pipelines.config import RunConfig
from pipelines.preflight.report import CheckResult

_MAX_LISTED = 20  # problems named in the message; all of them go to details

OnDisk = dict[str, tuple[str, int, str]]  # a split's files by path: (uri, bytes, sha256), as the shard scans read them


def check_manifest(cfg: RunConfig, found: dict[str, OnDisk]) -> CheckResult:
    """Count per split, presence, unlisted files, byte sizes, then sha256 (of the files as the
    shard scans read them, ``found``)."""
    entries = manifest.read(cfg.data.manifest)  # unreadable manifest: bad input, raised
    root = manifest.root_of(cfg.data.manifest)
    problems: list[str] = []
    counts, verified = {}, []
    for split in manifest.SPLITS:
        listed = {root.join(e.path).path: e for e in entries if e.split == split}
        on_disk = found[split]
        counts[split] = {"listed": len(listed), "on_disk": len(on_disk)}
        if not listed:
            problems.append(f"split '{split}' lists no files")
        for path, entry in sorted(listed.items()):
            seen = on_disk.get(path)
            if seen is None:
                exists = storage.exists(root.join(entry.path))
                problems.append(f"{entry.path}: listed as '{split}' but not under data.{split}" if exists
                                else f"{entry.path}: listed in the manifest but missing")
            elif (actual := seen[1]) != entry.bytes:
                problems.append(f"{entry.path}: size {actual} bytes, manifest says {entry.bytes}")
            else:
                verified.append((seen[2], entry))
        if not cfg.preflight.allow_unlisted:
            problems += [f"{uri}: present under data.{split} but not in the manifest"
                         for path, (uri, _, _) in sorted(on_disk.items()) if path not in listed]
    problems += [f"{entry.path}: sha256 differs from the manifest" for digest, entry in verified
                 if digest != entry.sha256]
    total = sum(c["listed"] for c in counts.values())
    per_split = ", ".join(f"{s}: {c['listed']}" for s, c in counts.items())
    message = (f"{total} files match the manifest ({per_split})"
               if not problems else f"{len(problems)} problem(s): " + "; ".join(problems[:_MAX_LISTED]))
    return CheckResult("manifest", not problems, message, {
        "manifest": str(cfg.data.manifest), "sha256": manifest.digest(cfg.data.manifest),
        "counts": counts, "bytes_verified": sum(e.bytes for _, e in verified), "problems": problems})
