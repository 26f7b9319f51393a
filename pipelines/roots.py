"""Where a run started from the UI or REST may read from: config roots and data roots.

A trigger's conf is typed by anyone who may trigger the DAG, and the task reads what it names
with the worker's rights. So a triggered run's config file and every file it ``extends:`` must
lie inside a config root (the deployment's config's folder, plus ``TAXIWAY_CONFIG_ROOTS``; the repo's
``configs/`` only where the deployment's config lives there), and be one the deployment lists
(``pipelines.config.deployment``); its data
paths inside a data root (``TAXIWAY_DATA_ROOTS``, default ``TAXIWAY_HOME``'s ``data/``,
``demo-data/`` and ``landing/``, never its runs, cache, Airflow home or MLflow store). A data path
may not hold a ``..`` segment; it is compared after symlinks are resolved, and so is every file a
split's folder or glob expands to, so neither a link nor a glob leads out. The CLI reads any local
path: its user already has the shell.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines import storage
from pipelines.errors import BadInput
from pipelines.run_folder import taxiway_home

REPO = Path(__file__).resolve().parents[1]
CONFIG_ROOTS_ENV = "TAXIWAY_CONFIG_ROOTS"
DATA_ROOTS_ENV = "TAXIWAY_DATA_ROOTS"
DATA_FIELDS = ("data.train", "data.val", "data.manifest", "tokenizer.path", "refresh.landing", "pretrained")
# a folder or a glob: each file it expands to is checked
SPLIT_FIELDS = ("data.train", "data.val", "pretrained")
SET_LISTS = ("eval.report_sets",)  # lists of splits: each entry is checked as a split
DEFAULT_DATA = ("data", "demo-data", "landing")  # under TAXIWAY_HOME when TAXIWAY_DATA_ROOTS is unset
_SHOWN = 10  # files named in one refusal at most


def data_values(cfg: Any) -> dict[str, str | None]:
    """Every data path a run config names, by dotted field (``eval.report_sets[1]`` for a list's entry)."""
    out: dict[str, str | None] = {}
    for dotted in (*DATA_FIELDS, *SET_LISTS):
        value = cfg
        for part in dotted.split("."):
            value = getattr(value, part)
        out.update({f"{dotted}[{i}]": v for i, v in enumerate(value)} if isinstance(value, list) else {dotted: value})
    return out


class OutOfBounds(BadInput):
    """A path outside the roots this deployment allows; the message names the field and the rule."""


def _is_uri(path: str) -> bool:
    """fsspec reads any ``::`` chain or ``://`` as a URI (``simplecache::relative/path`` included): so is it
    judged, held to the URI roots."""
    return "://" in path or "::" in path


def _real(path: str | Path) -> Path:
    return Path(os.path.realpath(os.path.expanduser(str(path))))


def _fixed(pattern: str) -> str:
    """A glob's part before its first wildcard."""
    return pattern[:min((pattern.find(c) for c in "*?[" if c in pattern), default=len(pattern))]


def _env_list(name: str) -> list[str]:
    """``$name`` split at each ``os.pathsep`` (``:``) but those inside a URI: its ``://``, its ``host:port``
    and a ``::`` chain stay whole, and any other entry (a relative folder included) is one of its own."""
    return [p for p in re.split(r"(?<!:):(?!:|//|\d+(?:[/:]|$))", os.environ.get(name, "")) if p.strip()]


@dataclass(frozen=True)
class Roots:
    configs: tuple[Path, ...]
    data: tuple[str, ...]         # local folders (resolved) or URI prefixes (s3://bucket/prefix)

    @classmethod
    def from_env(cls) -> Roots:
        # the deployment's own config's folder, and the repo's configs/ only when that is it
        default = Path(os.environ.get("TAXIWAY_CONFIG") or REPO / "configs" / "demo.yaml")
        configs = (*(Path(p) for p in _env_list(CONFIG_ROOTS_ENV)), default.parent)
        data = _env_list(DATA_ROOTS_ENV) or [str(taxiway_home() / name) for name in DEFAULT_DATA]
        return cls(tuple(_real(p) for p in configs),
                   tuple(p.rstrip("/") if _is_uri(p) else str(_real(p)) for p in data))

    # config files -------------------------------------------------------------------------------
    def inside_configs(self, path: Path) -> bool:
        real = _real(path)
        return any(real.is_relative_to(root) for root in self.configs)

    def config_file(self, name: str) -> Path:
        """The config a trigger names: absolute, or relative to the repo or to a config root."""
        if not name.endswith((".yaml", ".yml")):
            raise OutOfBounds(f"config {name[:200]!r}: not a .yaml/.yml file")
        candidates = [Path(name)] if Path(name).is_absolute() else [REPO / name, *(r / name for r in self.configs)]
        inside = [c for c in candidates if self.inside_configs(c)]
        if not inside:
            raise OutOfBounds(f"config {name[:200]!r}: outside the config roots")
        for candidate in inside:
            if candidate.is_file():
                return _real(candidate)
        raise OutOfBounds(f"config {name[:200]!r}: no such file in the config roots")

    def config_name(self, path: str | Path) -> str:
        """How a trigger names the config file ``path``: relative to the repo, else to a config root (the
        shortest name ``config_file`` resolves back to it), so the form shows no folder of this machine;
        the full path only when every shorter name leads to another file."""
        real = _real(path)
        for base in (REPO, *sorted(self.configs, key=lambda r: -len(r.parts))):
            if real.is_relative_to(base):
                name = str(real.relative_to(base))
                try:
                    if self.config_file(name) == real:
                        return name
                except OutOfBounds:
                    pass
        return str(real)

    # data paths ---------------------------------------------------------------------------------
    def inside_data(self, path: str) -> bool:
        """A URI by prefix; a local path (a glob by its fixed prefix) after symlinks are resolved."""
        if _is_uri(path):
            return any(_is_uri(r) and (path == r or path.startswith(r + "/")) and "/../" not in path + "/"
                       for r in self.data)
        return self._inside_local(_fixed(path) or ".") and self._inside_local(path)

    def _inside_local(self, path: str) -> bool:
        real = _real(path)
        return any(not _is_uri(r) and real.is_relative_to(r) for r in self.data)

    def check_data(self, values: dict[str, str | None]) -> None:
        """Refuse every data field (dotted name → path) outside the data roots, naming each; a split's
        files are checked one by one, so a trigger learns their names, never their contents."""
        bad = []
        for field, value in values.items():
            if not value:
                continue
            if not _is_uri(value) and not os.path.isabs(value):
                bad.append(f"{field}: {value!r} is relative (name data by an absolute path or a URI: a relative one "
                           "means whatever folder the worker runs in)")
            elif not _is_uri(value) and ".." in Path(value).parts:
                bad.append(f"{field}: {value!r} has a '..' segment (name data by a path without one)")
            elif not self.inside_data(value):
                bad.append(f"{field}: {value!r} is outside the data roots ({self.describe_data()})")
            elif (field in SPLIT_FIELDS or field.split("[")[0] in SET_LISTS) and not _is_uri(value):
                bad += self._escaped_files(field, value)
        if bad:
            raise OutOfBounds("; ".join(bad))

    def _escaped_files(self, field: str, spec: str) -> list[str]:
        """The files of a split (folder or glob) whose real path leaves the data roots, by their names
        below the folder the spec names (or its glob starts in)."""
        try:
            files = [loc.path for loc in storage.list_files(spec)]
        except storage.StorageError as exc:
            return [f"{field}: {exc}"]
        if not files and field.split("[")[0] in SET_LISTS:  # scored after training: an empty one fails here, first
            return [f"{field}: {spec!r} holds no files"]
        folder_inside = functools.cache(self._inside_local)  # a plain file is where its folder is: one realpath a folder
        out = [f for f in files if (os.path.islink(f) or not folder_inside(os.path.dirname(f)))
               and not self._inside_local(f)]
        if not out:
            return []
        listed = storage.locate(spec).path
        base = listed if os.path.isdir(listed) else os.path.dirname(_fixed(listed))
        names = [os.path.relpath(f, base) for f in out[:_SHOWN]]
        more = f" and {len(out) - _SHOWN} more" if len(out) > _SHOWN else ""
        return [f"{field}: {', '.join(names)}{more} in {spec!r} {'resolves' if len(out) == 1 else 'resolve'} "
                f"outside the data roots ({self.describe_data()})"]

    @staticmethod
    def describe_data() -> str:
        """Where the roots come from, not what they are: an error holds no value from the environment."""
        return f"set by {DATA_ROOTS_ENV}; by default {', '.join(n + '/' for n in DEFAULT_DATA)} in TAXIWAY_HOME"
