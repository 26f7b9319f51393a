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
from typing import Any

from pipelines.config import SECTIONS, ConfigError, RunConfig, load_config, suggest
from pipelines.roots import REPO, Roots

CONF_KEYS = ("config", "set", *SECTIONS)
_MISSING = object()


def _inline_refs(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        if "$ref" in node:
            target = defs[node["$ref"].rsplit("/", 1)[-1]]
            return _inline_refs({**target, **{k: v for k, v in node.items() if k != "$ref"}}, defs)
        return {k: _inline_refs(v, defs) for k, v in node.items() if k != "$defs"}
    if isinstance(node, list):
        return [_inline_refs(v, defs) for v in node]
    return node


def section_schemas() -> dict[str, dict[str, Any]]:
    """Self-contained JSON schema per RunConfig section (no ``$ref``, nothing required).

    Params built from these validate a partial override at trigger time; the full RunConfig
    validation (required data paths, cross-field rules) runs in the first task.
    """
    schema = RunConfig.model_json_schema()
    defs = schema.get("$defs", {})
    out = {}
    for name, prop in schema["properties"].items():
        inlined = _inline_refs(prop, defs)
        inlined.pop("required", None)
        inlined.pop("default", None)
        out[name] = inlined
    return out


def default_config_path() -> str:
    return os.environ.get("TAXIWAY_CONFIG", str(REPO / "configs" / "demo.yaml"))


@lru_cache(maxsize=4)
def form_defaults(config_path: str) -> dict[str, Any]:
    return load_config(config_path).model_dump(mode="json")


def _form_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """``anyOf`` of plain types → a type list, which the trigger form renders as one field; closed
    objects list their field names (``propertyNames``) instead of ``additionalProperties: false``,
    so Airflow's refusal of a typo quotes that list rather than the whole section's schema."""
    schema = copy.deepcopy(schema)
    variants = schema.get("anyOf")
    if variants and all(set(v) == {"type"} for v in variants):
        schema.pop("anyOf")
        schema["type"] = [v["type"] for v in variants]
    if schema.get("additionalProperties") is False and "properties" in schema:
        schema.pop("additionalProperties")
        schema["propertyNames"] = {"enum": list(schema["properties"])}
    for key, sub in schema.get("properties", {}).items():
        schema["properties"][key] = _form_schema(sub)
    return schema


def build_params() -> dict[str, Any]:
    from airflow.sdk import Param

    path = default_config_path()
    defaults = form_defaults(path)
    schemas = section_schemas()
    params: dict[str, Any] = {
        "config": Param(path, type="string", pattern=r"\.ya?ml$", title="Config file",
                        examples=Roots.from_env().config_files(),
                        description="YAML run config from this deployment's config roots (pick one or type a path "
                                    "inside them); the sections below overlay it"),
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


def check_conf(conf: dict[str, Any]) -> None:
    """Refuse what the params cannot: unknown top-level keys (Airflow accepts any) and ``${VAR}``
    references, which would read the worker's environment into the config and its logs."""
    errors = {str(k): "not a conf key" + suggest(str(k), CONF_KEYS) + f"; expected one of {', '.join(CONF_KEYS)}"
              for k in conf if k not in CONF_KEYS}

    def walk(value: Any, where: str) -> None:
        if isinstance(value, dict):
            for key, sub in value.items():
                walk(sub, f"{where}.{key}")
        elif isinstance(value, list):
            for i, sub in enumerate(value):
                walk(sub, f"{where}[{i}]")
        elif isinstance(value, str) and "${" in value:
            errors[where] = "environment references (${...}) are not allowed in a trigger's conf"

    for key in CONF_KEYS[1:]:
        if key in conf:
            walk(conf[key], key)
    if errors:
        raise ConfigError(errors, "conf")


def overrides_from_conf(conf: dict[str, Any]) -> dict[str, Any]:
    defaults = form_defaults(default_config_path())
    out = {}
    for name in SECTIONS:
        if name in conf:
            diff = changed_leaves(conf[name], defaults.get(name))
            if diff is not _MISSING:
                out[name] = diff
    return out
