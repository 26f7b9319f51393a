"""Check that the files in the data folders are exactly the files the manifest promises."""

from __future__ import annotations

from pipelines import manifest, storage
from pipelines.config import RunConfig
from pipelines.preflight.report import CheckResult

_MAX_LISTED = 20  # problems named in the message; all of them go to details


def check_manifest(cfg: RunConfig, workers: int | None = None) -> CheckResult:
    """Count per split, presence, unlisted files, byte sizes, then sha256 (hashed in parallel)."""
    entries = manifest.read(cfg.data.manifest)  # unreadable manifest: bad input, raised
    root = manifest.root_of(cfg.data.manifest)
    problems: list[str] = []
    counts, to_hash = {}, []
    for split in manifest.SPLITS:
        listed = {root.join(e.path).path: e for e in entries if e.split == split}
        on_disk = {loc.path: loc for loc in storage.list_files(getattr(cfg.data, split))}
        counts[split] = {"listed": len(listed), "on_disk": len(on_disk)}
        if not listed:
            problems.append(f"split '{split}' lists no files")
        for path, entry in sorted(listed.items()):
            loc = on_disk.get(path)
            if loc is None:
                exists = storage.exists(root.join(entry.path))
                problems.append(f"{entry.path}: listed as '{split}' but not under data.{split}" if exists
                                else f"{entry.path}: listed in the manifest but missing")
            elif (actual := storage.size(loc)) != entry.bytes:
                problems.append(f"{entry.path}: size {actual} bytes, manifest says {entry.bytes}")
            else:
                to_hash.append((loc, entry))
        if not cfg.preflight.allow_unlisted:
            problems += [f"{loc.uri()}: present under data.{split} but not in the manifest"
                         for path, loc in sorted(on_disk.items()) if path not in listed]
    digests = manifest.hash_files([loc for loc, _ in to_hash], workers, desc="verifying sha256")
    problems += [f"{entry.path}: sha256 differs from the manifest"
                 for (_, entry), digest in zip(to_hash, digests, strict=True) if digest != entry.sha256]
    total = sum(c["listed"] for c in counts.values())
    per_split = ", ".join(f"{s}: {c['listed']}" for s, c in counts.items())
    message = (f"{total} files match the manifest ({per_split})"
               if not problems else f"{len(problems)} problem(s): " + "; ".join(problems[:_MAX_LISTED]))
    return CheckResult("manifest", not problems, message, {
        "manifest": str(cfg.data.manifest), "sha256": manifest.digest(cfg.data.manifest),
        "counts": counts, "bytes_verified": sum(e.bytes for _, e in to_hash), "problems": problems})
