"""Trigger-form Params built from the RunConfig JSON schema.

The form shows the fields people change (``form_fields``) one by one, titled in words, grouped in
sections, with the schema's descriptions, enums (dropdowns) and bounds; every section is also one
JSON Param (the fields not shown on their own) under the form's advanced section. Defaults come
from the default config file, so the form shows the config a run will use. Airflow validates a
trigger's conf against these schemas before the run is created; the ``resolve_config`` task then
validates the whole RunConfig.

Merge rule: a run's config is the ``config`` file, overlaid with every leaf of the conf that
differs from the form's default, then the ``set`` overrides. A leaf may come from a section
(``{"train": {"lr": 3e-4}}``, what REST callers send) or from its form field (``train_lr``); when
both are sent, the one that differs from the form's default wins, and two that differ from it and
from each other are refused, naming both keys.
"""

from __future__ import annotations

import copy
import json
from functools import lru_cache
from typing import Any

from airflow.sdk import Param

from pipelines.config import SECTIONS, ConfigError, RunConfig, deployment, load_config, suggest
from pipelines.config.load import MAX_DEPTH, parse_overrides
from pipelines.config.trust import OWNED, owner_reason
from pipelines.roots import Roots
from taxiway_airflow.conf_numbers import bad_numbers
from taxiway_airflow.form_fields import ADVANCED, ALL_FIELDS, GROUPS, SECTION_TITLES, FormField

# Airflow checks a Param's schema against its dialect's metaschema on every resolve, and serializing
# a DAG (the DAG processor on every parse, the api-server, dag.test) resolves every param of every
# task twice: jsonschema's default dialect, 2020-12, checks 4x slower than draft 7 on these schemas,
# which use no keyword that draft 7 lacks (bench/dag_parse_bench.py, tests/test_trigger_form.py).
DIALECT = "http://json-schema.org/draft-07/schema#"
FIELD_KEYS = tuple(f.key for f in ALL_FIELDS)
CONF_KEYS = ("config", "set", *SECTIONS, *FIELD_KEYS)
MAX_CONF_BYTES = 64 * 1024  # a run's settings as JSON; the whole config of the largest preset is ~5 KiB
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
    return str(deployment.path())


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


def _field_schema(prop: dict[str, Any]) -> dict[str, Any]:
    """One form field's schema from its RunConfig property: ``X | None`` becomes a type list with
    ``"null"`` (so the form does not mark it required) and its enum gains ``None``; an integer's
    exclusive bound becomes the inclusive one the form's number input shows as min/max."""
    out = {k: copy.deepcopy(v) for k, v in prop.items() if k not in ("default", "title", "anyOf")}
    for variant in prop.get("anyOf", []):
        out["type"] = [*out.get("type", []), variant["type"]]
        for key, value in variant.items():
            if key == "enum":
                out["enum"] = [*out.get("enum", []), *value]
            elif key != "type":
                out[key] = value
    types = out["type"] if isinstance(out["type"], list) else [out["type"]]
    if "null" in types and "enum" in out:
        out["enum"].append(None)
    if "integer" in types:
        if "exclusiveMinimum" in out:
            out["minimum"] = out.pop("exclusiveMinimum") + 1
        if "exclusiveMaximum" in out:
            out["maximum"] = out.pop("exclusiveMaximum") - 1
    return out


def param(*default: Any, **schema: Any) -> Any:
    """An Airflow ``Param`` whose schema declares ``DIALECT``."""
    return Param(*default, **schema, **{"$schema": DIALECT})


def _form_field(f: FormField, default: Any, group: str, schemas: dict[str, dict[str, Any]]) -> Any:
    """The Param of one form field, in the form section ``group``; its description is the schema's
    (every form field has one) followed by its config path."""
    schema = _field_schema(schemas[f.section]["properties"][f.leaf])
    if f.values_display:
        schema["values_display"] = f.values_display
    if f.examples:
        schema["examples"] = list(f.examples)
    description = f"{schema.pop('description')} [{f.path}]"
    return param(copy.deepcopy(default), description=description, title=f.title, section=group, **schema)


def build_params() -> dict[str, Any]:
    """The trigger form: run-level fields first (the form's open section), then ``form_fields``'s
    sections, then each config section's remaining fields as JSON, less the fields only the
    deployment sets (a section wholly the deployment's is not offered at all)."""
    path, roots = default_config_path(), Roots.from_env()
    defaults = form_defaults(path)
    schemas = section_schemas()
    params: dict[str, Any] = {
        "config": param(roots.config_name(path), type="string", pattern=r"\.ya?ml$", title="Config file",
                        examples=[roots.config_name(path), *defaults["limits"]["trigger_may_choose"]],
                        description="YAML run config: this deployment's, or one it lets a trigger choose "
                                    "(limits.trigger_may_choose; the fields only the deployment sets stay its own); "
                                    "every field below overlays it where it differs from its default"),
        "name": param(defaults["name"], title=SECTION_TITLES["name"], **_field_schema(schemas["name"])),
        "parent": param(defaults["parent"], title=SECTION_TITLES["parent"], **_field_schema(schemas["parent"])),
        "pretrained": param(defaults["pretrained"], title=SECTION_TITLES["pretrained"],
                            **_field_schema(schemas["pretrained"])),
        "set": param([], type=["array", "null"], items={"type": "string"}, title="Overrides",
                     description="key.path=value lines applied last, over everything else, e.g. train.lr=3e-4"),
    }
    for group, fields in GROUPS.items():
        for f in fields:
            params[f.key] = _form_field(f, defaults[f.section][f.leaf], group, schemas)
    shown = {f.path for fields in GROUPS.values() for f in fields}
    for name in SECTIONS:
        if name in params or name in OWNED:
            continue
        rest = {k: v for k, v in defaults[name].items()
                if f"{name}.{k}" not in shown and owner_reason(f"{name}.{k}") is None}
        schema = _form_schema(schemas[name])
        schema["type"] = ["object", "null"]
        about = schema.pop("description")
        params[name] = param(copy.deepcopy(rest), **{**schema, "section": ADVANCED,
                                                     "title": f"{SECTION_TITLES[name]} ({name})"},
                             description=f"{about} Fields of {name} not shown above; a REST conf may send any "
                                         f"field of the section here, e.g. {{\"{name}\": {{...}}}}.")
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


def check_conf(conf: dict[str, Any], extra_keys: tuple[str, ...] = (), keys: tuple[str, ...] | None = None) -> None:
    """Refuse what the params cannot: unknown top-level keys (Airflow accepts any), a conf too large
    or too deeply nested to be a run's settings, and, anywhere in it (``set`` lines' values too), a
    number msgpack cannot carry to a task, named by its key, never echoed. Values are taken as they
    are: ``${VAR}`` in a conf is text, never read from the worker's environment (docs/security.md).
    ``extra_keys``: a DAG's own keys beside the config's (taxiway_sweep's ``sweep``); ``keys``: a DAG's
    whole set instead of the config's (taxiway_land's params): every DAG's first task runs this check."""
    known = (CONF_KEYS if keys is None else keys) + extra_keys
    expected = (f"expected config, set, a config section ({', '.join(SECTIONS)}) or a form field "
                f"(section_field, e.g. {FIELD_KEYS[0]}, train_lr)" if keys is None else f"expected {', '.join(known)}")
    errors = {str(k)[:80]: "not a conf key" + suggest(str(k), known) + f"; {expected}" for k in conf if k not in known}
    if len(json.dumps(conf, default=str)) > MAX_CONF_BYTES:
        errors["conf"] = f"larger than {MAX_CONF_BYTES // 1024} KiB as JSON"
    if (deepest := max((_depth(v) for v in conf.values()), default=0)) > MAX_DEPTH:
        errors["conf"] = f"nested {deepest} levels deep; at most {MAX_DEPTH}"
    else:
        errors |= {path: why for key, value in conf.items() for path, why in bad_numbers(value, str(key)[:80])}
        lines = conf.get("set")
        if isinstance(lines, list) and all(isinstance(line, str) for line in lines):
            try:
                pairs = parse_overrides(lines, "set")
            except ConfigError:
                pairs = []  # the first task names what is wrong with the lines
            errors |= {f"set[{i}] ({key[:80]})": why for i, (key, value) in enumerate(pairs)
                       for _, why in bad_numbers(value, key)}
    if errors:
        raise ConfigError(errors, "conf")


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


def overrides_from_conf(conf: dict[str, Any]) -> dict[str, Any]:
    """The leaves of ``conf`` that overlay the config file: those that differ from the form's default,
    from sections and from form fields alike (the merge rule in this module's docstring). A section
    sent as null changes nothing; a form field that contradicts its section's leaf is refused."""
    defaults = form_defaults(default_config_path())
    out: dict[str, Any] = {}
    for name in SECTIONS:
        if name in conf and not (conf[name] is None and isinstance(defaults.get(name), dict)):
            diff = changed_leaves(conf[name], defaults.get(name))
            if diff is not _MISSING:
                out[name] = diff
    errors = {}
    for f in ALL_FIELDS:
        value = conf.get(f.key, _MISSING)
        if value is _MISSING or value == defaults[f.section][f.leaf]:
            continue
        nested = out.get(f.section, {}).get(f.leaf, _MISSING)
        if nested is not _MISSING and nested != value:
            errors[f.key] = (f"contradicts {f.path} in the conf's {f.section!r} section (both differ from the form's "
                             "default and from each other); send one of them")
            continue
        out.setdefault(f.section, {})[f.leaf] = value
    if errors:
        raise ConfigError(errors, "conf")
    return out


def sweep_param() -> Any:
    """taxiway_sweep's ``sweep`` field: a grid or a list of points (``pipelines.sweep.points`` checks it
    against the config in the first task). The default sweeps the learning rate around the form's."""
    lr = form_defaults(default_config_path())["train"]["lr"]
    return param({"train.lr": [lr, float(f"{lr / 3:.3g}")]}, type=["object", "array"], title="Sweep",
                 description="A grid over dotted config leaves, every combination trained: "
                             "{\"train.lr\": [0.001, 0.0003], \"model.n_layer\": [2, 4]}; or a list of points: "
                             "[{\"train.lr\": 0.001}, {\"train.lr\": 0.0003, \"train.steps\": 200}]. 2 to 16 "
                             "members; keys under data, preflight, tokenizer, pack, eval, parent, name and "
                             "registry are refused (every member shares those stages)")
