"""Where a run started from the UI or REST may read from: config roots and data roots.

A trigger's conf is typed by anyone who may trigger the DAG, and the task reads what it names
with the worker's rights. So a triggered run's config file and every file it ``extends:`` must
lie inside a config root (the repo's ``configs/`` plus ``TAXIWAY_CONFIG_ROOTS``), and its data
paths inside a data root (``TAXIWAY_DATA_ROOTS``, default ``TAXIWAY_HOME``). Paths are compared
after symlinks and ``..`` are resolved, so neither leads out. The CLI reads any local path: its
user already has the shell.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pipelines.errors import BadInput
from pipelines.run_folder import taxiway_home

REPO = Path(__file__).resolve().parents[1]
CONFIG_ROOTS_ENV = "TAXIWAY_CONFIG_ROOTS"
DATA_ROOTS_ENV = "TAXIWAY_DATA_ROOTS"
DATA_FIELDS = ("data.train", "data.val", "data.manifest", "tokenizer.path", "refresh.landing")


class OutOfBounds(BadInput):
    """A path outside the roots this deployment allows; the message names the field and the rule."""


def _is_uri(path: str) -> bool:
    return "://" in path


def _real(path: str | Path) -> Path:
    return Path(os.path.realpath(os.path.expanduser(str(path))))


def _env_list(name: str) -> list[str]:
    return [p for p in os.environ.get(name, "").split(os.pathsep) if p.strip()]


@dataclass(frozen=True)
class Roots:
    configs: tuple[Path, ...]
    data: tuple[str, ...]         # local folders (resolved) or URI prefixes (s3://bucket/prefix)

    @classmethod
    def from_env(cls) -> Roots:
        default = os.environ.get("TAXIWAY_CONFIG")  # the deployment's own default config is trusted
        configs = (REPO / "configs", *(Path(p) for p in _env_list(CONFIG_ROOTS_ENV)),
                   *([Path(default).parent] if default else []))
        data = _env_list(DATA_ROOTS_ENV) or [str(taxiway_home())]
        return cls(tuple(_real(p) for p in configs),
                   tuple(p.rstrip("/") if _is_uri(p) else str(_real(p)) for p in data))

    # config files -------------------------------------------------------------------------------
    def inside_configs(self, path: Path) -> bool:
        real = _real(path)
        return any(real.is_relative_to(root) for root in self.configs)

    def config_file(self, name: str) -> Path:
        """The config a trigger names: absolute, or relative to the repo or to a config root."""
        if not name.endswith((".yaml", ".yml")):
            raise OutOfBounds(f"config {name!r}: not a .yaml/.yml file")
        candidates = [Path(name)] if Path(name).is_absolute() else [REPO / name, *(r / name for r in self.configs)]
        inside = [c for c in candidates if self.inside_configs(c)]
        if not inside:
            raise OutOfBounds(f"config {name!r}: outside the config roots ({self.describe_configs()})")
        for candidate in inside:
            if candidate.is_file():
                return _real(candidate)
        raise OutOfBounds(f"config {name!r}: no such file in the config roots ({self.describe_configs()})")

    def config_files(self) -> list[str]:
        """Every config file in the roots, repo ones relative to the repo: the trigger form's choices."""
        found = []
        for root in self.configs:
            for path in sorted([*root.rglob("*.yaml"), *root.rglob("*.yml")]):
                found.append(str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path))
        return list(dict.fromkeys(found))

    def describe_configs(self) -> str:
        return ", ".join(str(r) for r in self.configs) + f"; add folders with {CONFIG_ROOTS_ENV}"

    # data paths ---------------------------------------------------------------------------------
    def inside_data(self, path: str) -> bool:
        if _is_uri(path):
            return any(_is_uri(r) and (path == r or path.startswith(r + "/")) and "/../" not in path + "/"
                       for r in self.data)
        fixed = path[:min((path.find(c) for c in "*?[" if c in path), default=len(path))]
        real = _real(fixed or ".")
        return any(not _is_uri(r) and real.is_relative_to(r) for r in self.data)

    def check_data(self, values: dict[str, str | None]) -> None:
        """Refuse every data field (dotted name → path) outside the data roots, naming each."""
        bad = [f"{field}: {value!r} is outside the data roots ({', '.join(self.data)}; set {DATA_ROOTS_ENV})"
               for field, value in values.items() if value and not self.inside_data(value)]
        if bad:
            raise OutOfBounds("; ".join(bad))

