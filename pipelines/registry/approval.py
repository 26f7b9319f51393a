"""A person's approval between a passed gate and the champion alias (``registry.approval: required``).

With ``required``, registration stops short of promotion: the version is tagged ``pending`` and
holds no alias while an Airflow human-in-the-loop task waits. The decision is then applied here,
under the champion lock like every alias move: *approve* moves ``champion`` only while the champion
is still the model the version was evaluated against (for a refresh: its parent), so a person never
approves a comparison that no longer holds; *reject* and a *timeout* leave it ``challenger``. Who
decided, when and their comment are tags on the version (docs/evaluation.md, "Approval").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pipelines.config import RegistryConfig
from pipelines.registry.champion import ChampionMoved, Outcome, promote, set_challenger
from pipelines.registry.client import client, with_retries

TAG = "taxiway.approval"            # pending | approved | rejected | timed_out
BY_TAG, AT_TAG, COMMENT_TAG = f"{TAG}.by", f"{TAG}.at", f"{TAG}.comment"
MAX_COMMENT = 2000                  # characters of a person's comment kept on the version
Choice = Literal["approved", "rejected", "timed_out"]


@dataclass(frozen=True)
class Decision:
    """What the person (or the timeout) decided, as the human-in-the-loop task returned it."""

    choice: Choice
    by: str | None        # the deciding user's name; None for a timeout
    at: str               # UTC ISO 8601
    comment: str = ""
    by_id: str | None = None  # the deciding user's id (what ``registry.approvers`` lists); None for a timeout

    def __post_init__(self) -> None:
        if self.choice not in ("approved", "rejected", "timed_out"):
            raise ValueError(f"approval decision: {self.choice!r} is not approved, rejected or timed_out")

    def tags(self) -> dict[str, str]:
        return {TAG: self.choice, BY_TAG: self.by or "(timeout)", AT_TAG: self.at,
                COMMENT_TAG: self.comment[:MAX_COMMENT]}

    def reason(self, timeout_s: float) -> str:
        """Why the version holds the alias it ends with (the ``taxiway.alias_reason`` tag)."""
        if self.choice == "timed_out":
            return f"not promoted: no one approved it within registry.approval_timeout_s ({timeout_s:.0f} s)"
        return f"not promoted: rejected by {self.by} at {self.at}"


def refusal(decision: Decision, approvers: list[str], triggered_by: str | None) -> str | None:
    """Why ``decision`` may not decide (None when it may): separation of duties. The user who triggered
    the run never approves or rejects it, and where the deployment names ``registry.approvers``, only
    they do. A timeout is no one's answer, and always stands."""
    if decision.choice == "timed_out":
        return None
    who = decision.by_id or decision.by
    if who is None:
        return "the answer names no user"
    if triggered_by is not None and who == triggered_by:
        return f"user {who!r} triggered this run, and may not answer its own approval"
    if approvers and who not in approvers:
        return f"user {who!r} is not one of registry.approvers"
    return None


@dataclass(frozen=True)
class Standing:
    """A decision already on a version, and the alias it holds now (None: neither Taxiway alias)."""

    choice: Choice
    alias: str | None
    reason: str


def standing(reg: RegistryConfig, version: str) -> Standing | None:
    """The decision a person (or the timeout) already made on ``version``, if any: a registration run
    again after it (a cleared task) keeps it instead of asking again."""
    def read() -> Standing | None:
        mv = client().get_model_version(reg.model_name, version)
        tags, aliases = mv.tags or {}, mv.aliases or []
        if tags.get(TAG) in (None, "pending"):
            return None
        alias = next((a for a in (reg.champion_alias, reg.challenger_alias) if a in aliases), None)
        return Standing(tags[TAG], alias, tags.get("taxiway.alias_reason", ""))

    return with_retries(reg, "read the version's approval", read)


def mark_pending(reg: RegistryConfig, version: str) -> None:
    """Tag a version that passed its gate as waiting for a person (no alias moves)."""
    with_retries(reg, "tag the version pending approval",
                 lambda: client().set_model_version_tag(reg.model_name, version, TAG, "pending"))


def _tag(reg: RegistryConfig, version: str, tags: dict[str, str]) -> None:
    def write() -> None:
        c = client()
        for key, value in tags.items():
            c.set_model_version_tag(reg.model_name, version, key, value)

    with_retries(reg, "tag the approval decision", write)


def apply(reg: RegistryConfig, version: str, report: dict[str, Any], decision: Decision) -> Outcome:
    """Record ``decision`` on the version and move its alias: ``champion`` on an approval while the
    champion is still the one ``report`` was evaluated against, else ``challenger``. Safe to repeat
    (a retried task): the tags are rewritten and ``promote`` knows a version that already won."""
    _tag(reg, version, decision.tags())
    if decision.choice != "approved":
        return set_challenger(reg, version, decision.reason(reg.approval_timeout_s))
    outcome = promote(reg, version, report)
    if isinstance(outcome, ChampionMoved):
        return set_challenger(reg, version, (
            f"approved by {decision.by}, but not promoted: the champion moved to version {outcome.found} "
            f"while this model waited, evaluated against {outcome.expected or 'the floor'}; train or refresh again"))
    return Outcome(outcome.alias, f"{outcome.reason}; approved by {decision.by} at {decision.at}")
