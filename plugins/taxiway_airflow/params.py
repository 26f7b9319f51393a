"""Trigger-form Params built from the RunConfig JSON schema.

One object Param per config section, its default taken from the default config file, so the
form shows the config a run will use. Airflow validates a trigger's conf against these schemas
before the run is created; the ``resolve_config`` task then validates the whole RunConfig.

Merge rule: a run's config is the ``config`` file, overlaid with every leaf of the conf that
differs from the form's default, then the ``set`` overrides. A REST call may send only the
fields it changes (``{"train": {"lr": 3e-4}}``).
"""

from __future__ import annotations

import copy
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

from pipelines.config import SECTIONS, load_config, section_schemas

REPO = Path(__file__).resolve().parents[2]
_MISSING = object()


def default_config_path() -> str:
    return os.environ.get("TAXIWAY_CONFIG", str(REPO / "configs" / "demo.yaml"))


@lru_cache(maxsize=4)
def form_defaults(config_path: str) -> dict[str, Any]:
    return load_config(config_path).model_dump(mode="json")


def _form_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """``anyOf`` of plain types → a type list, which the trigger form renders as one field."""
    schema = copy.deepcopy(schema)
    variants = schema.get("anyOf")
    if variants and all(set(v) == {"type"} for v in variants):
        schema.pop("anyOf")
        schema["type"] = [v["type"] for v in variants]
    return schema


def build_params() -> dict[str, Any]:
    from airflow.sdk import Param

    path = default_config_path()
    defaults = form_defaults(path)
    schemas = section_schemas()
    params: dict[str, Any] = {
        "config": Param(path, type="string", title="Config file",
                        description="YAML run config; the sections below overlay it"),
        "set": Param([], type="array", items={"type": "string"}, title="Overrides",
                     description="key.path=value overrides applied last, e.g. train.lr=3e-4"),
    }
    for name in SECTIONS:
        params[name] = Param(copy.deepcopy(defaults[name]), **_form_schema(schemas[name]))
    return params


def changed_leaves(value: Any, default: Any) -> Any:
    """The parts of ``value`` that differ from ``default`` (``_MISSING`` when none do)."""
    if isinstance(value, dict) and isinstance(default, dict):
        out = {}
        for key, sub in value.items():
            diff = changed_leaves(sub, default.get(key, _MISSING))
            if diff is not _MISSING:
                out[key] = diff
        return out or _MISSING
    return _MISSING if value == default else value


def overrides_from_conf(conf: dict[str, Any]) -> dict[str, Any]:
    defaults = form_defaults(default_config_path())
    out = {}
    for name in SECTIONS:
        if name in conf:
            diff = changed_leaves(conf[name], defaults.get(name))
            if diff is not _MISSING:
                out[name] = diff
    return out
