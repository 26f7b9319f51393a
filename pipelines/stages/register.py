"""Registration (docs/evaluation.md): the model logged and registered in MLflow with its lineage,
then ``champion`` moved to it only on a pass (and, for a refresh, only while its parent holds it),
else ``challenger``."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from pipelines import registry
from pipelines.config import RunConfig
from pipelines.errors import CheckFailed
from pipelines.refresh import ledger
from pipelines.refresh.plan import RefreshPlan
from pipelines.registry import approval
from pipelines.run_folder import RunFolder
from pipelines.stages import evaluate
from pipelines.stages.prepare import StageInputError, require
from trainer import fsio

log = logging.getLogger("taxiway.stages")


def run(cfg: RunConfig, run_dir: Path, run_key: str, airflow: dict[str, str] | None = None,
        refresh: RefreshPlan | None = None) -> dict[str, Any]:
    """Log and register the model (idempotent per ``run_key``), then move ``champion`` or
    ``challenger`` to it. This stage owns re-evaluation: when the champion moved since the model
    was evaluated, it is evaluated again against the new champion and promotion is tried again, at
    most ``registry.max_reevaluations`` times; a champion that kept moving leaves it ``challenger``.
    A refresh (``refresh``: its plan) is not re-evaluated: it continues its parent, so a champion that
    is no longer that parent leaves it ``challenger`` and its batches new to the champion's next refresh.
    With ``registry.approval: required`` a version that passed holds no alias yet: ``decide`` moves it
    once a person answered (``pipelines.registry.approval``)."""
    folder, reg = RunFolder(run_dir), cfg.registry
    report = json.loads(require(folder.eval_report, "evaluate").read_text())
    registered = registry.register(cfg, run_dir, run_key, report, airflow)
    if refresh is not None:
        ledger.record(reg, registered, run_dir, refresh.parent_ledger, refresh.new)
    if reg.approval == "required" and report["passed"]:
        known = approval.standing(reg, registered.version)
        if known is None:
            approval.mark_pending(reg, registered.version)
            result = {**registered.record(None, f"{report['reason']}; waiting for a person's approval"),
                      "approval": "pending"}
        else:
            result = {**registered.record(known.alias, known.reason), "approval": known.choice}
        fsio.write_json(folder.registry_record, result)
        return result
    outcome = registry.promote(reg, registered.version, report)
    if refresh is not None and isinstance(outcome, registry.ChampionMoved):
        outcome = registry.set_challenger(reg, registered.version, refresh.parent_moved(outcome))
    for attempt in range(1, reg.max_reevaluations + 1):
        if not isinstance(outcome, registry.ChampionMoved):
            break
        log.info("champion of %s is version %s, not %s as evaluated: evaluating again against it",
                 reg.model_name, outcome.found, outcome.expected or "none (floor)")
        report = evaluate.run(cfg, run_dir, outcome.baseline)
        registry.record_reevaluation(reg, registered, run_dir, report, attempt)
        outcome = registry.promote(reg, registered.version, report)
    if isinstance(outcome, registry.ChampionMoved):
        outcome = registry.set_challenger(reg, registered.version, outcome.reason)
    result = registered.record(outcome.alias, outcome.reason)
    fsio.write_json(folder.registry_record, result)
    return result


def registry_record(run_dir: Path) -> dict[str, Any]:
    """What registration made (``registry.json``); ``StageInputError`` before it ran."""
    return json.loads(require(RunFolder(run_dir).registry_record, "register").read_text())


def awaits_approval(run_dir: Path) -> bool:
    """Whether this run's registration is waiting for a person (``registry.approval: required``)."""
    return RunFolder(run_dir).registry_record.exists() and registry_record(run_dir).get("approval") == "pending"


def decide(cfg: RunConfig, run_dir: Path, decision: approval.Decision, mirror: Path | None = None,
           triggered_by: str | None = None, approvers: list[str] | None = None) -> dict[str, Any]:
    """Apply a person's decision (or the timeout) to the version this run registered pending approval;
    ``mirror``: another run folder whose record copies this one's (a sweep's, of its best member).
    An answer from ``triggered_by`` (the user who triggered the run) or from anyone not in
    ``approvers`` (``registry.approvers`` as user ids; those ids themselves by default) is refused
    (``approval.refusal``): recorded, and the version stays pending."""
    folder, record = RunFolder(run_dir), registry_record(run_dir)
    if record.get("approval") not in ("pending", decision.choice):
        raise StageInputError(f"{folder.registry_record}: version {record.get('version')} is not waiting for "
                              f"approval (approval: {record.get('approval', 'auto')})")
    if why := approval.refusal(decision, cfg.registry.approvers if approvers is None else approvers, triggered_by):
        refused = {"approval_refused": {"by": decision.by_id or decision.by, "at": decision.at, "why": why}}
        for path in {run_dir, mirror or run_dir}:
            fsio.write_json(RunFolder(path).registry_record, {**registry_record(path), **refused})
        raise CheckFailed(f"{record['model_name']} version {record['version']}: the answer was not applied: {why}. "
                          "The version stays pending; clear register.approval to ask an approver again")
    report = json.loads(require(folder.eval_report, "evaluate").read_text())
    outcome = approval.apply(cfg.registry, str(record["version"]), report, decision)
    decided = {"alias": outcome.alias, "reason": outcome.reason, "approval": decision.choice,
               "approval_by": decision.by, "approval_at": decision.at}
    fsio.write_json(folder.registry_record, {**record, **decided})
    if mirror is not None and mirror != run_dir:
        fsio.write_json(RunFolder(mirror).registry_record, {**registry_record(mirror), **decided})
    return {**record, **decided}


def summary(run_dir: Path) -> str:
    """The registered run in a dozen lines, for a person at a terminal."""
    folder = RunFolder(run_dir)
    reg = json.loads(require(folder.registry_record, "register").read_text())
    ev = json.loads(folder.eval_report.read_text())
    held = "waiting for a person's approval" if reg.get("approval") == "pending" else f"alias '{reg['alias']}'"
    c, b, g = ev["candidate"], ev["baseline"], ev["gate"]
    return "\n".join([
        "Taxiway run summary",
        f"  registered model : {reg['model_name']} version {reg['version']} ({held})",
        f"  model URI        : {reg['uri']}",
        f"  validation       : {c['loss']:.4f} nats/token, {c['bits_per_byte']:.4f} bits/byte, "
        f"perplexity {c['perplexity']:.2f}",
        f"  baseline         : {b['label']}{' (' + b['note'] + ')' if b.get('note') else ''}: "
        f"{b['loss']:.4f} nats/token, {b['bits_per_byte']:.4f} bits/byte",
        f"  gate             : {'PASSED' if ev['passed'] else 'FAILED'} - improvement {g['improvement_bpb']:+.4f} "
        f"bits/byte, {g['confidence']:.0%} lower bound {g['lower_bpb']:+.4f} (required > 0 and "
        f">= {g['min_improvement']:+.4f})",
        f"  alias reason     : {reg.get('reason', ev['reason'])}",
        f"  MLflow run       : {reg['run_id']} (experiment '{reg['experiment']}')",
        f"  run folder       : {run_dir}",
        f"  report           : {folder.eval / 'report.md'}",
    ])
