"""Who may set what: the fields only the deployment sets, and the check that refuses them from a trigger.

A trigger (the form, a REST conf, ``set`` lines, sweep points, DAG params) comes from anyone allowed
to trigger a DAG. It may change a run within the deployment's limits, but not where the run executes,
what decides whether its model wins, or the limits themselves (docs/security.md has the whole table).
A deployment that wants its users to set one of these lists it in ``limits.trigger_may_set``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from pydantic import BaseModel

from pipelines.config.base import ConfigError
from pipelines.config.schema import SECTIONS, RunConfig

_GATE = "the evaluation gate's policy: what a candidate must beat, and how surely"
_CLEAN = "what keeps the gate's validation set apart from the training data"
OWNED: dict[str, str] = {
    "data.val": "the validation set the gate judges every candidate on (a run's own sets go in eval.report_sets: "
                "reported beside it, never deciding)",
    "preflight.max_overlap_fraction": _CLEAN,
    "preflight.max_duplicate_fraction": _CLEAN,
    "preflight.overlap_jaccard": _CLEAN,
    "preflight.num_perm": _CLEAN,
    "preflight.shingle_words": _CLEAN,
    "preflight.action": _CLEAN,
    "compute.launcher": "where training runs",
    "compute.kubernetes": "the cluster, namespace, image, Secrets, service account and volume pods run with",
    "eval.baseline": _GATE,
    "eval.floor": _GATE,
    "eval.min_improvement": _GATE,
    "eval.confidence": _GATE,
    "eval.bootstrap_samples": _GATE,
    "eval.max_batches": _GATE,
    "eval.batch_size": _GATE,
    "eval.seed": _GATE,
    "registry.model_name": "the registered model the deployment's runs compete in",
    "registry.champion_alias": "the alias that only a passed gate moves",
    "registry.challenger_alias": "the alias that only a passed gate moves",
    "registry.lock_timeout_s": "how long a run may hold back the champion's compare-and-set",
    "registry.max_reevaluations": "how often a run may be judged again against a moved champion",
    "registry.approval": "whether a person approves a promotion",
    "registry.approval_timeout_s": "whether a person approves a promotion",
    "registry.approval_reminder_s": "whether a person approves a promotion",
    "registry.approvers": "who may approve a promotion",
    "refresh": "the refresh's landing zone, schedule and policy",
    "limits": "the deployment's ceilings and what its triggers may set",
    "alerts": "who is told about the deployment's failures, and through which connections",
}


def leaves(value: Any, where: str) -> Iterator[str]:
    """The dotted paths a trigger's value sets at ``where``: a mapping's leaves, anything else itself."""
    if isinstance(value, dict) and value:
        for key, sub in value.items():
            yield from leaves(sub, f"{where}.{key}" if where else str(key))
    elif where:
        yield where


def _covers(outer: str, inner: str) -> bool:
    return inner == outer or inner.startswith(outer + ".")


def owner_reason(path: str, allowed: Iterable[str] = ()) -> str | None:
    """Why only the deployment may set ``path`` (None when a trigger may). A path that replaces a
    section holding owned fields (``compute={...}``) is owned too: it would reset them."""
    if any(_covers(a, path) for a in allowed):
        return None
    for owned, why in OWNED.items():
        if _covers(owned, path):
            return why
        if _covers(path, owned) and not any(_covers(a, owned) for a in allowed):
            return f"it replaces {owned}: {why}; set the section's other fields one by one"
    return None


def refusal(path: str, allowed: Iterable[str] = ()) -> str | None:
    """The error for a trigger that sets ``path`` (None when it may): names the rule, never a value."""
    why = owner_reason(path, allowed)
    return None if why is None else (f"only the deployment sets this ({why}); a deployment that lets its users "
                                     "set it lists it in limits.trigger_may_set")


def refuse_owned(paths: Iterable[str], allowed: Iterable[str], source: str) -> None:
    """Raise naming every path of ``paths`` that only the deployment sets."""
    allowed = tuple(allowed)
    errors = {p: why for p in dict.fromkeys(paths) if (why := refusal(p, allowed))}
    if errors:
        raise ConfigError(errors, source)


def allowed_by(raw: dict[str, Any]) -> tuple[str, ...]:
    """``limits.trigger_may_set`` of a deployment config as read (before validation: the full
    validation comes after the trigger's overlay); a malformed list allows nothing."""
    limits = raw.get("limits")
    listed = limits.get("trigger_may_set") if isinstance(limits, dict) else None
    return tuple(p for p in listed if isinstance(p, str)) if isinstance(listed, list) else ()


# what docs/security.md's table says beside a section's cell (``table``)
NOTES: dict[tuple[str, str], str] = {
    ("data", "trigger"): "every file inside the data roots",
    ("data", "deployment"): "the validation set every candidate is judged on",
    ("preflight", "deployment"): "what keeps that set apart from the training data",
    ("tokenizer", "trigger"): "`path` inside the data roots",
    ("compute", "deployment"): "cluster connection, namespace, service account, image, Secrets, volume, labels, env, "
                               "resources, security context",
    ("eval", "deployment"): "the gate's policy and how it is computed",
    ("alerts", "deployment"): "Airflow connection ids and recipients; addresses and secrets stay in the "
                              "connections: [alerts.md](alerts.md)",
}


def _model(annotation: Any) -> type[BaseModel] | None:
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _names(model: type[BaseModel], prefix: str) -> Iterator[tuple[str, str]]:
    """(name as the table shows it, dotted path) for each field under ``prefix``; a sub-section the
    deployment owns whole is one name, ``sub.*``."""
    for name, field in model.model_fields.items():
        path, sub = f"{prefix}.{name}", _model(field.annotation)
        if sub is not None and path not in OWNED:
            yield from ((f"{name}.{shown}", p) for shown, p in _names(sub, path))
        else:
            yield (f"{name}.*" if sub is not None else name), path


def table() -> str:
    """docs/security.md's table of who sets what, one row per config section, from ``OWNED``: the page
    is generated from this code, so the two cannot disagree (``python -m pipelines.config.trust``)."""
    rows = ["| section | a trigger may set (within the schema's bounds and `limits`) | only the deployment sets |",
            "|---|---|---|"]
    for section in SECTIONS:
        model = _model(RunConfig.model_fields[section].annotation)
        fields = [(section, section)] if model is None else list(_names(model, section))
        cells = []
        for column, owned in (("trigger", False), ("deployment", True)):
            names = [f"`{shown}`" for shown, path in fields if (owner_reason(path) is not None) == owned]
            note = NOTES.get((section, column))
            cells.append((", ".join(names) + (f" ({note})" if note else "")) if names else "–")
        rows.append(f"| `{section}` | {cells[0]} | {cells[1]} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(table())
