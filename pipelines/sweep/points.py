"""A sweep's points: the ``sweep`` param, a grid or a list of points over dotted config leaves.

Grid: ``{"train.lr": [0.001, 0.0003], "model.n_layer": [2, 4]}`` (the cartesian product, keys in the
order given). List: ``[{"train.lr": 0.001}, {"train.lr": 0.0003, "train.steps": 200}]``. Every point
overlays the run's config and must give a valid RunConfig, checked before any stage runs, so a typo
or a value the schema rejects fails in the first task. All members share one preflight, one tokenize
and one evaluation set, so keys that would change those are refused (``SHARED``).
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from pipelines.config import ConfigError, RunConfig, suggest, validate
from pipelines.config.trust import refusal
from pipelines.run_folder import RunFolder
from trainer import fsio

MIN_MEMBERS, MAX_MEMBERS = 2, 16  # one member is a plain run; more than 16 gangs on one sweep is a queue

SHARED = {  # top-level keys a point may not set, and why
    "name": "names the MLflow experiment every member logs to",
    "data": "the data is preflighted and tokenized once for every member",
    "preflight": "every member shares one preflight",
    "tokenizer": "every member shares one tokenizer and packed dataset",
    "pack": "every member shares one packed dataset",
    "parent": "the parent decides the tokenizer every member shares",
    "registry": "only the best member is registered, to one registered model",
    "eval": "members are ranked on one evaluation set with one setting",
    "refresh": "a sweep is no refresh",
}


@dataclass(frozen=True)
class Member:
    """One point of the sweep and the config it gives."""

    index: int
    point: dict[str, Any]
    config: RunConfig


def _where(index: int, key: str | None = None) -> str:
    return f"sweep[{index}]" + (f".{key}" if key else "")


def _size(count: int, most: int) -> None:
    if not MIN_MEMBERS <= count <= most:
        raise ConfigError({"sweep": f"{count:,} member(s); a sweep has {MIN_MEMBERS} to {most}"}, "sweep")


def expand(spec: Any, most: int = MAX_MEMBERS) -> list[dict[str, Any]]:
    """The points of a grid (cartesian product) or a list of points, not yet checked against the config.
    The count is checked from the lists' lengths before any point is built (a short grid can name millions)."""
    if isinstance(spec, dict):
        if not spec:
            raise ConfigError({"sweep": "empty grid; give each config leaf a list of values"}, "sweep")
        bad = {f"sweep.{k}"[:200]: "a grid gives each key a non-empty list of values" for k, v in spec.items()
               if not isinstance(v, list) or not v}
        if bad:
            raise ConfigError(bad, "sweep")
        _size(math.prod(len(v) for v in spec.values()), most)
        keys = list(spec)
        return [dict(zip(keys, values, strict=True)) for values in itertools.product(*(spec[k] for k in keys))]
    if isinstance(spec, list):
        _size(len(spec), most)
        bad = {_where(i): "a point is a mapping of dotted config leaves to values" for i, p in enumerate(spec)
               if not isinstance(p, dict) or not p}
        if bad:
            raise ConfigError(bad, "sweep")
        return [dict(p) for p in spec]
    raise ConfigError({"sweep": "expected a grid ({\"train.lr\": [0.001, 0.0003]}) or a list of points "
                                "([{\"train.lr\": 0.001}, {\"train.lr\": 0.0003}])"}, "sweep")


def _leaf_problem(base: RunConfig, key: str) -> str | None:
    """Why ``key`` is not a config leaf a point may set (None when it is one)."""
    parts = key.split(".")
    if parts[0] in SHARED:
        return f"not sweepable: {SHARED[parts[0]]}"
    node: Any = base
    for depth, part in enumerate(parts):
        fields = list(type(node).model_fields) if isinstance(node, BaseModel) else []
        if part not in fields:
            where = ".".join(parts[:depth]) or "the config"
            return f"unknown config leaf: {where} has no field {part!r}{suggest(part, fields)}"
        node = getattr(node, part)
    if isinstance(node, BaseModel):
        return f"{key} is a section, not a leaf; name one of its fields ({', '.join(type(node).model_fields)})"
    return None


def _overlay(raw: dict[str, Any], point: dict[str, Any]) -> dict[str, Any]:
    out = json.loads(json.dumps(raw))
    for key, value in point.items():
        *parents, leaf = key.split(".")
        node = out
        for part in parents:
            node = node[part]
        node[leaf] = value
    return out


def members(base: RunConfig, spec: Any) -> list[Member]:
    """The sweep's members, each checked against the RunConfig; every problem named by point and key.
    A point is a trigger's: its keys are refused where only the deployment sets them, its values are
    values (never expanded), and the count stays within ``limits.sweep_members``."""
    points = expand(spec, base.limits.sweep_members)
    errors: dict[str, str] = {}
    for i, point in enumerate(points):
        for key in point:
            if (why := refusal(key, base.limits.trigger_may_set) or _leaf_problem(base, key)) is not None:
                errors[_where(i, key)] = why
    if errors:
        raise ConfigError(errors, "sweep")
    raw = base.model_dump(mode="json")
    out: list[Member] = []
    for i, point in enumerate(points):
        try:
            out.append(Member(i, point, validate(_overlay(raw, point), _where(i))))
        except ConfigError as exc:
            errors.update({_where(i, path): why for path, why in exc.errors.items()})
    seen: dict[str, int] = {}
    for m in out:
        if (first := seen.setdefault(m.config.sha256(), m.index)) != m.index:
            errors[_where(m.index)] = f"same config as sweep[{first}]: each member must differ"
    if errors:
        raise ConfigError(errors, "sweep")
    return out


def write(run_dir: Path, chosen: list[Member]) -> Path:
    """``sweep/points.json``: the points as validated (members are rebuilt from it and ``config.yaml``)."""
    path = RunFolder(run_dir).sweep_points
    fsio.write_json(path, [m.point for m in chosen])
    return path


def read(run_dir: Path, base: RunConfig) -> list[Member]:
    path = RunFolder(run_dir).sweep_points
    if not path.exists():
        raise ConfigError({"sweep": f"{path}: missing; the sweep's first task did not run"}, "sweep")
    return members(base, json.loads(path.read_text()))
