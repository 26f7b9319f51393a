"""Loading a RunConfig: YAML files composed with ``extends:`` (inside the config roots when a
trigger chose the file), ``${VAR}`` expanded from the environment in those files only, an overlay
dict (a DAG run's conf), then dotted ``--set key=value`` overrides. What a trigger sends (overlay,
``set``) is taken as values: never expanded, parsed as plain YAML (no tags, anchors or aliases),
bounded in size and depth, and refused where only the deployment may set it (``trust``). Errors
name every bad field by its dotted path and never echo a file's contents.

"""

from __future__ import annotations

import copy
import difflib
import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from pipelines.config.base import ConfigError
from pipelines.config.schema import SECTIONS, RunConfig
from pipelines.roots import Roots
from pipelines.run_folder import taxiway_home

_VAR = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}")
MAX_SET_LINES = 64       # ``set`` lines of one trigger
MAX_SET_CHARS = 4096     # characters of one ``set`` line
MAX_DEPTH = 8            # nesting of a value a trigger sends (lists and mappings)


def _expand(value: Any, where: str, errors: dict[str, str]) -> Any:
    """Expand ``${VAR}`` / ``${VAR:-default}``; TAXIWAY_HOME always resolves."""
    if isinstance(value, dict):
        return {k: _expand(v, f"{where}.{k}" if where else k, errors) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, f"{where}[{i}]", errors) for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(2)
        if name == "TAXIWAY_HOME":
            return str(taxiway_home())
        if name in os.environ:
            return os.environ[name]
        if default is not None:
            return default
        errors[where] = f"environment variable {name} is not set"
        return m.group(0)

    return _VAR.sub(sub, value)


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Overlay ``over`` onto ``base``: dicts merge key by key, anything else replaces."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def suggest(name: str, known: list[str] | tuple[str, ...]) -> str:
    """`` (did you mean 'x'?)`` for a near-miss of one of ``known`` (a typo), else ''."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _check_sections(raw: dict[str, Any], source: str, from_file: bool = True) -> None:
    """Refuse top-level keys that are no config section, with a did-you-mean.

    In a file, only near-misses (typos) are named: any other unknown key means the file is not a
    RunConfig at all, and nothing of it is shown, since an error message must not echo a file
    someone pointed the config at (a kubeconfig, a Secret). Keys a user typed are always named.
    """
    unknown = [k for k in raw if k not in SECTIONS and k != "extends"]
    typos = {k: suggest(str(k), list(SECTIONS)) for k in unknown}
    foreign = [k for k, hint in typos.items() if not hint]
    if from_file and (foreign or (unknown and len(unknown) == len(raw))):
        raise ConfigError({"<file>": f"not a RunConfig: {len(foreign) or len(unknown)} top-level key(s) are no "
                                     f"config section (not shown); sections: {', '.join(SECTIONS)}"}, source)
    if unknown:
        raise ConfigError({str(k): f"not a config section{typos[k]}" for k in unknown}, source)


def read_yaml_chain(path: str | Path, roots: Roots | None = None, _seen: tuple[Path, ...] = (),
                    expand: bool = True) -> dict[str, Any]:
    """Read a YAML config and the files it ``extends:`` (relative to itself), base first.

    With ``roots`` (runs started from a trigger), every file of the chain must lie inside a config root.
    ``expand=False`` for a file Taxiway wrote itself (a run folder's ``config.yaml``): its values are
    already resolved, and a trigger's ``${VAR}`` in it is text that must stay text.
    """
    path = Path(path).resolve()
    if roots is not None and not roots.inside_configs(path):
        raise ConfigError({"<file>": "outside the config roots"}, str(path))
    if path in _seen:
        raise ConfigError({"extends": f"cycle through {path}"}, str(path))
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise ConfigError({"<file>": "does not exist"}, str(path)) from None
    except (UnicodeDecodeError, IsADirectoryError):
        raise ConfigError({"<file>": "not a text file"}, str(path)) from None
    except yaml.YAMLError as exc:  # where, never what: the snippet would echo the file
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError({"<file>": f"not valid YAML{where}"}, str(path)) from None
    if not isinstance(raw, dict):
        raise ConfigError({"<file>": "not a RunConfig: its top level is not a mapping"}, str(path))
    _check_sections(raw, str(path))
    errors: dict[str, str] = {}
    if expand:
        raw = _expand(raw, "", errors)  # the deployment's own files: the only place ${VAR} means anything
    if errors:
        raise ConfigError(errors, str(path))
    parents = raw.pop("extends", None) or []
    merged: dict[str, Any] = {}
    for parent in [parents] if isinstance(parents, str) else parents:
        merged = deep_merge(merged, read_yaml_chain(path.parent / parent, roots, _seen + (path,), expand))
    return deep_merge(merged, raw)


def parse_value(text: str, key: str, source: str = "--set") -> Any:
    """One ``key=value``'s value as YAML (``3e-4``, ``true``, ``[1, 2]``, ``{a: b}``), refusing tags,
    anchors and aliases (``*a`` would let a short line expand into a huge value), and values nested
    deeper than ``MAX_DEPTH``; a malformed value is bad input naming ``key`` (never its text)."""
    if not text.strip():
        return None
    if len(text) > MAX_SET_CHARS:
        raise ConfigError({key: f"value longer than {MAX_SET_CHARS} characters"}, source)
    depth = 0
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
                raise ConfigError({key: "YAML anchors and aliases (&, *) are not allowed in a value"}, source)
            if getattr(event, "tag", None) is not None:
                raise ConfigError({key: "YAML tags (!...) are not allowed in a value"}, source)
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    raise ConfigError({key: f"value nested deeper than {MAX_DEPTH} levels"}, source)
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
        value = yaml.safe_load(text)
    except yaml.YAMLError as exc:  # where, never what
        mark = getattr(exc, "problem_mark", None)
        where = f" at column {mark.column + 1}" if mark else ""
        raise ConfigError({key: f"value is not valid YAML{where}"}, source) from None
    if isinstance(value, str) and re.fullmatch(r"[-+]?\d*\.?\d+[eE][-+]?\d+", value):
        value = float(value)  # YAML 1.1 reads 3e-4 as a string
    return value


def parse_overrides(items: list[str], source: str = "--set") -> list[tuple[str, Any]]:
    """``key.path=value`` lines as (dotted key, value) pairs, each value parsed by ``parse_value``."""
    if len(items) > MAX_SET_LINES:
        raise ConfigError({source: f"{len(items)} lines; at most {MAX_SET_LINES}"}, source)
    out = []
    for item in items:
        if not isinstance(item, str):
            raise ConfigError({source: "each line is a string key.path=value"}, source)
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError({item[:80]: "expected key.path=value"}, source)
        out.append((key.strip(), parse_value(text, key.strip(), source)))
    return out


def apply_overrides(raw: dict[str, Any], overrides: list[str] | list[tuple[str, Any]]) -> dict[str, Any]:
    """Apply ``key.path=value`` lines (or pairs from ``parse_overrides``): each replaces one node."""
    pairs = [p if isinstance(p, tuple) else parse_overrides([p])[0] for p in overrides]
    out = copy.deepcopy(raw)
    for key, value in pairs:
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError({key: f"{part} is not a section"}, "--set")
        node[leaf] = value
    return out


def _field_names(loc: tuple[Any, ...]) -> list[str]:
    """The fields a model at ``loc`` (the parent of an unknown field) accepts."""
    model: Any = RunConfig
    for part in loc:
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return []
        model = field.annotation
    return list(getattr(model, "model_fields", {}))


def _reason(err: dict[str, Any]) -> str:
    """One line per error: the rule, never the offending value."""
    if err["type"] == "extra_forbidden":
        return "unknown field" + suggest(str(err["loc"][-1]), _field_names(err["loc"][:-1]))
    return err["msg"]


def validate(raw: dict[str, Any], source: str = "config") -> RunConfig:
    errors: dict[str, str] = {}
    _check_sections(raw, source, from_file=False)  # files were checked as read: this catches overrides
    try:
        return RunConfig.model_validate(raw)
    except ValidationError as exc:
        for err in exc.errors():
            path = ".".join(str(p) for p in err["loc"]) or "<root>"
            errors[path] = _reason(err)
        raise ConfigError(errors, source) from None


def load_config(path: str | Path, overrides: list[str] | None = None,
                extra: dict[str, Any] | None = None, roots: Roots | None = None, expand: bool = True) -> RunConfig:
    """File (with extends) → ``extra`` overlay (e.g. a DAG run's conf) → ``--set`` overrides.

    ``roots`` confines the file chain to the config roots (runs started from a trigger); ``expand``:
    ``read_yaml_chain``'s."""
    raw = read_yaml_chain(path, roots, expand=expand)
    if extra:
        raw = deep_merge(raw, extra)
    return validate(apply_overrides(raw, overrides or []), str(path))
