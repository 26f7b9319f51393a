"""The deployment's own config: the file ``TAXIWAY_CONFIG`` names (default ``configs/demo.yaml``), the one
source of every field only the deployment sets (``trust.OWNED``).

A trigger may name another config file only where this one lists it (``limits.trigger_may_choose``),
and the fields the deployment owns come from here whichever file it names. Every task reads its run
folder's ``config.yaml`` held to this config too (``check_run``): a folder whose owned fields differ is
refused, naming them, so neither a rewritten file nor a policy changed under a running run decides
anything the deployment did not say (docs/security.md).
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

from pipelines.config import trust
from pipelines.config.base import ConfigError
from pipelines.config.load import apply_overrides, deep_merge, parse_overrides, read_yaml_chain, validate
from pipelines.config.schema import RunConfig
from pipelines.roots import REPO, OutOfBounds, Roots

ENV = "TAXIWAY_CONFIG"
DEFAULT = REPO / "configs" / "demo.yaml"
_ABSENT = object()


def path() -> Path:
    """The deployment's config file, resolved."""
    return Path(os.path.realpath(os.environ.get(ENV) or DEFAULT))


def raw() -> dict[str, Any]:
    """The deployment's config as read (its ``extends:`` chain merged, ``${VAR}`` expanded: its own files)."""
    return read_yaml_chain(path())


def config() -> RunConfig:
    return validate(raw(), str(path()))


def choose(name: str | Path, own: dict[str, Any], roots: Roots) -> Path:
    """The config file a trigger names: the deployment's own, or one its ``limits.trigger_may_choose``
    lists (each relative to the deployment config's folder, or absolute), inside the config roots."""
    found = roots.config_file(str(name))
    if found == path():
        return found
    listed = (own.get("limits") or {}).get("trigger_may_choose") if isinstance(own.get("limits"), dict) else None
    for entry in listed if isinstance(listed, list) else []:
        candidate = Path(os.path.realpath(path().parent / str(entry)))
        if candidate == found:
            return found
    raise OutOfBounds(f"config {str(name)[:200]!r}: not a config this deployment lets a trigger choose "
                      "(its limits.trigger_may_choose)")


def _get(tree: Any, parts: list[str]) -> Any:
    for part in parts:
        if not isinstance(tree, dict) or part not in tree:
            return _ABSENT
        tree = tree[part]
    return tree


def impose(chosen: dict[str, Any], own: dict[str, Any]) -> dict[str, Any]:
    """``chosen`` (a config as read) with every deployment-owned field as ``own`` has it (absent
    there: absent here too, so the schema's default holds)."""
    out = copy.deepcopy(chosen)
    for dotted in trust.OWNED:
        *parents, leaf = dotted.split(".")
        node = out
        for part in parents:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        value = _get(own, dotted.split("."))
        if value is _ABSENT:
            node.pop(leaf, None)
        else:
            node[leaf] = copy.deepcopy(value)
    return out


def _flat(tree: Any, where: str) -> dict[str, Any]:
    if isinstance(tree, dict) and tree:
        return {k: v for key, sub in tree.items() for k, v in _flat(sub, f"{where}.{key}" if where else key).items()}
    return {where: tree}


def owned_differences(cfg: RunConfig, expected: RunConfig) -> list[str]:
    """The deployment-owned leaves where ``cfg`` differs from ``expected``, less those ``expected``'s
    ``limits.trigger_may_set`` lets a trigger set."""
    mine, theirs = _flat(cfg.model_dump(mode="json"), ""), _flat(expected.model_dump(mode="json"), "")
    allowed = tuple(expected.limits.trigger_may_set)
    return sorted(k for k in mine.keys() | theirs.keys()
                  if trust.owner_reason(k, allowed) is not None and mine.get(k, _ABSENT) != theirs.get(k, _ABSENT))


def check_run(cfg: RunConfig, expected: RunConfig, source: str) -> RunConfig:
    """``cfg`` (a run folder's config) when every owned field is the deployment's (``expected``), else
    refused naming each field that differs (never its value)."""
    if differ := owned_differences(cfg, expected):
        raise ConfigError({k: "differs from the deployment's config; only the deployment sets it" for k in differ},
                          source)
    return cfg


def load_triggered(chosen: str | Path | None, overlay: dict[str, Any], sets: list[str], roots: Roots) -> RunConfig:
    """A config as a trigger asks for it: the deployment's config, or the file the trigger names (``chosen``) when the deployment lists it in ``limits.trigger_may_choose`` (inside
    ``roots``), with every deployment-owned field taken from the deployment's config all the same; then
    the trigger's ``overlay`` and ``sets`` as values, refused where only the deployment may set a field
    unless its ``limits.trigger_may_set`` allows it."""
    own = raw()
    file = path() if chosen is None else choose(chosen, own, roots)
    # a file the deployment lists is its own to vouch for, its extends: chain too
    chain = own if file == path() else impose(read_yaml_chain(file), own)
    pairs = parse_overrides(sets, "set")
    paths = [*trust.leaves(overlay, ""), *(p for key, value in pairs for p in (key, *trust.leaves(value, key)))]
    trust.refuse_owned(paths, trust.allowed_by(own), "conf")
    return validate(apply_overrides(deep_merge(chain, overlay), pairs), str(file))
