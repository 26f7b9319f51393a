"""Who holds ``champion``, and the model to beat.

``champion`` moves from X to Y only when Y's gate passed against X, atomically. Two runs can
finish together, each having beaten the champion it was evaluated against. The invariant that
keeps ``champion`` off the worse model: under the lock (``locks``), read the current champion;
set the alias to the candidate only if that is still the model the candidate was evaluated
against (none: the floor). Otherwise the champion moved meanwhile: ``promote`` returns
``ChampionMoved``, and the register stage (``pipelines.stages.register``) evaluates the candidate
again against the new champion, outside the lock, and tries again. Every move of the alias is
thus a gate decision between exactly the two models involved.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.config import RegistryConfig, RunConfig
from pipelines.errors import BadInput
from pipelines.registry.client import WEIGHTS_TAG, client, download, resolve_version, with_retries
from pipelines.registry.locks import champion_lock

CHAMPION_TAG = "taxiway.champion_version"  # registered-model tag: the version Taxiway last made champion


class ChampionMissing(BadInput):
    """The champion alias is gone because its version was deleted: refuse to guess a baseline."""


@dataclass(frozen=True)
class Outcome:
    """The alias a registered version holds now, and why."""

    alias: str
    reason: str


@dataclass(frozen=True)
class ChampionMoved:
    """The champion is no longer the model the report was evaluated against: nothing moved."""

    model_name: str
    found: str | None     # the version holding the alias now (None: no champion, so the floor)
    expected: str | None  # the version the report was evaluated against (None: the floor)

    @property
    def baseline(self) -> str:
        """What to evaluate against now: the new champion, or ``floor``."""
        return f"models:/{self.model_name}/{self.found}" if self.found else "floor"

    @property
    def reason(self) -> str:
        """Why the candidate stays ``challenger`` when the champion kept moving."""
        return (f"not promoted: the champion moved to version {self.found} while this model "
                f"was evaluated against {self.expected or 'the floor'}; evaluate it again")


NO_CHAMPION = ("floor", "pretrained")  # baselines that stand in while no model holds the champion alias


@dataclass(frozen=True)
class Baseline:
    """The model a candidate is evaluated against, downloaded."""

    kind: str            # champion | parent | uri | pretrained
    uri: str
    name: str
    version: str
    folder: Path         # downloaded model folder (model.safetensors, model.json, tokenizer.json)
    weights_sha256: str | None


# --- the champion as it is now ---------------------------------------------------------------------

def _absent(exc: Exception) -> bool:
    code, msg = getattr(exc, "error_code", ""), getattr(exc, "message", "")
    return code == "RESOURCE_DOES_NOT_EXIST" or (code == "INVALID_PARAMETER_VALUE" and "not found" in msg)


def current_champion(c, name: str, alias: str, missing_ok: bool = False):
    """The version holding ``alias``; None when no version ever did (or a person removed the
    alias). ``ChampionMissing`` when the alias vanished with its deleted version, unless ``missing_ok``."""
    from mlflow.exceptions import MlflowException  # mlflow (~1 s): DAG parse must not pay for it

    try:
        return c.get_model_version_by_alias(name, alias)
    except MlflowException as exc:
        if not _absent(exc):
            raise
    try:
        last = c.get_registered_model(name).tags.get(CHAMPION_TAG)
    except MlflowException as exc:
        if _absent(exc):
            return None
        raise
    if last is None or missing_ok:
        return None
    try:
        c.get_model_version(name, last)
        return None  # the version is there: the alias was removed on purpose
    except MlflowException as exc:
        if not _absent(exc):
            raise
    raise ChampionMissing(
        f"models:/{name}@{alias}: the champion, version {last}, was deleted and its alias with it, so there is "
        f"nothing to evaluate against. Point the alias at the version to beat "
        f"(MlflowClient().set_registered_model_alias({name!r}, {alias!r}, VERSION)), or run with "
        f"eval.baseline=floor to start over from the floor")


def resolve_baseline(cfg: RunConfig, dest: Path, choice: str | None = None) -> Baseline | None:
    """The model to beat (``choice`` overrides ``eval.baseline``), or None: compare with the floor
    (``floor``, or ``champion`` while no model holds the alias)."""
    choice = choice or cfg.eval.baseline
    reg = cfg.registry
    if choice == "floor":
        return None
    if choice == "champion":
        mv = with_retries(reg, "read the champion", lambda: current_champion(
            client(), reg.model_name, reg.champion_alias))
        if mv is None:
            return None
        kind, uri = "champion", f"models:/{reg.model_name}@{reg.champion_alias}"
    else:
        uri = cfg.parent if choice == "parent" else choice
        if not uri:
            raise BadInput("eval.baseline: 'parent' needs a parent model (config field parent)")
        mv = resolve_version(uri, reg)
        kind = "parent" if choice == "parent" else "uri"
        if kind == "uri" and mv.name == reg.model_name and reg.champion_alias in (mv.aliases or []):
            kind = "champion"  # e.g. the pinned champion a re-evaluation compares against
    return Baseline(kind, uri, mv.name, str(mv.version), download(mv, dest, reg),
                    (mv.tags or {}).get(WEIGHTS_TAG))


# --- moving the aliases -------------------------------------------------------------------------------

def _evaluated_against(report: dict[str, Any], name: str) -> str | None:
    """The champion this report's gate decided against: None for the floor or the pretrained start
    (no champion was there), a version of ``name``, or a marker that matches no champion (a baseline
    from elsewhere)."""
    base = report["baseline"]
    if base["kind"] in NO_CHAMPION:
        return None
    return str(base["version"]) if base.get("name") == name else f"{base.get('name')}/{base.get('version')}"


def set_challenger(reg: RegistryConfig, version: str, reason: str) -> Outcome:
    """``challenger`` for a version that did not win — unless it already is the champion (the same
    run registered again, evaluated against itself): that keeps its alias. Under the champion lock, as
    every alias move is: the check and the move are one step against a champion move in between."""

    def mark() -> Outcome:
        c = client()
        with champion_lock(c, reg.model_name, reg.lock_timeout_s):
            mv = current_champion(c, reg.model_name, reg.champion_alias, missing_ok=True)
            if mv is not None and str(mv.version) == version:
                return Outcome(reg.champion_alias, f"already the champion; this evaluation: {reason}")
            c.set_registered_model_alias(reg.model_name, reg.challenger_alias, version)
            c.set_model_version_tag(reg.model_name, version, "taxiway.alias_reason", reason[:5000])
        return Outcome(reg.challenger_alias, reason)

    return with_retries(reg, "set the challenger alias", mark)


def _compare_and_set(reg: RegistryConfig, version: str, expected: str | None,
                     report: dict[str, Any]) -> tuple[bool, str | None]:
    """Under the lock: make ``version`` champion if the champion is still ``expected``.
    Returns (done, the champion found)."""
    name, alias = reg.model_name, reg.champion_alias
    c = client()
    with champion_lock(c, name, reg.lock_timeout_s):
        mv = current_champion(c, name, alias, missing_ok=report["baseline"]["kind"] in NO_CHAMPION)
        found = str(mv.version) if mv is not None else None
        if found == version:
            return True, found  # a retried task: this version already won
        if found != expected:
            return False, found
        c.set_registered_model_alias(name, alias, version)
        c.set_registered_model_tag(name, CHAMPION_TAG, version)
        c.set_model_version_tag(name, version, "taxiway.replaced_champion",
                                f"models:/{name}/{found}" if found else f"none ({report['baseline']['kind']})")
        c.set_model_version_tag(name, version, "taxiway.alias_reason", report["reason"][:5000])
        return True, found


def promote(reg: RegistryConfig, version: str, report: dict[str, Any]) -> Outcome | ChampionMoved:
    """One try: ``challenger`` when the gate failed; ``champion`` when it passed against the model
    that is still champion; else ``ChampionMoved`` (no alias moved: evaluate against the new one)."""
    if not report["passed"]:
        return set_challenger(reg, version, report["reason"])
    expected = _evaluated_against(report, reg.model_name)
    done, found = with_retries(reg, "move the champion alias",
                               lambda: _compare_and_set(reg, version, expected, report))
    if done:
        return Outcome(reg.champion_alias, report["reason"])
    return ChampionMoved(reg.model_name, found, expected)
