"""Where a refresh run's dataset lies in its run folder (``assemble`` builds it, ``plan`` points the
run's config at it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from pipelines import manifest, storage
from pipelines.config import DataConfig, RunConfig
from pipelines.errors import BadInput
from pipelines.run_folder import RunFolder

NEW, FRESH, EARLIER = "batches", "fresh", "earlier"


@dataclass(frozen=True)
class Layout:
    root: Path
    val_rel: str

    @property
    def train(self) -> Path:
        return self.root / NEW

    @property
    def val(self) -> Path:
        return self.root / self.val_rel

    @property
    def manifest(self) -> Path:
        return self.root / "manifest.jsonl"

    @property
    def fresh(self) -> Path:
        return self.root / FRESH

    @property
    def fresh_manifest(self) -> Path:
        return self.root / "fresh.jsonl"

    def earlier(self, batch_id: str) -> Path:
        """An earlier batch's held-out slice, scored parent vs candidate to show forgetting."""
        return self.root / EARLIER / batch_id

    def earlier_manifest(self, batch_id: str) -> Path:
        return self.root / f"{EARLIER}-{batch_id}.jsonl"


def layout(base: RunConfig | DataConfig, run_dir: Path) -> Layout:
    """Where the refresh dataset lies; the fixed val keeps its path relative to the base manifest."""
    data = base.data if isinstance(base, RunConfig) else base
    try:
        val_rel = storage.relative(storage.locate(data.val), manifest.root_of(data.manifest))
    except ValueError:
        raise BadInput(f"data.val {data.val}: a refresh needs the validation folder under the manifest's "
                       f"folder ({manifest.root_of(data.manifest).uri()})") from None
    if PurePosixPath(val_rel).parts[:1] in ((NEW,), (FRESH,), (EARLIER,)) or val_rel in ("", "."):
        raise BadInput(f"data.val {data.val}: its folder name {val_rel!r} is reserved in a refresh dataset")
    return Layout(RunFolder(run_dir).refresh_data, val_rel)
