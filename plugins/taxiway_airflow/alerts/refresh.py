"""What a refresh's plan alerts about, checked by the plan task on every refresh (the cron's too):

- ``batch_quarantined``: a batch reached ``refresh.max_attempts`` failed refreshes. Once per
  quarantine (batch, manifest, champion, the failed run that tipped it), not on every later plan
  that finds it still quarantined; released and quarantined again, it alerts again.
- ``champion_stale``: landed batches wait (new to the champion, or held back) and the champion has
  gone ``refresh.max_age_s`` without a refresh since the first of them landed. Counted from the later
  of the two (the champion's making, the oldest waiting batch's landing): a champion is not stale
  before there is data to refresh it on, so a batch landing after a quiet month is a refresh, not an
  alarm. Once per champion per ``max_age_s`` period.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pipelines.config import RunConfig
from pipelines.config.schema import RegistryConfig
from pipelines.refresh.plan import RefreshPlan
from pipelines.registry import resolve_version
from pipelines.registry.approval import AT_TAG, TAG
from taxiway_airflow.alerts.alert import Alert, span
from taxiway_airflow.alerts.delivery import deliver, why
from taxiway_airflow.alerts.once import claim

log = logging.getLogger("taxiway")

MAX_NAMED = 10  # batch names an alert lists; the rest are counted


def _named(ids: list[str]) -> str:
    more = len(ids) - MAX_NAMED
    return ", ".join(ids[:MAX_NAMED]) + (f" and {more} more" if more > 0 else "")


def quarantined(plan: RefreshPlan, dag_id: str, run_id: str) -> list[Alert]:
    """An alert per batch this plan found quarantined that no plan alerted on before."""
    out = []
    for batch in plan.quarantined:
        runs = batch["attempts"]
        key = f"batch_quarantined {batch['id']} {batch['manifest_sha256']} {plan.champion} {runs[-1] if runs else ''}"
        if claim(key):
            out.append(Alert("batch_quarantined", dag_id, run_id,
                             f"batch {batch['id']} is quarantined: it took part in {len(runs)} failed refresh(es) "
                             f"of {plan.champion}; no refresh takes it again until it is released (the batches page) or "
                             "landed anew"))
    return out


def champion_since(champion: str, reg: RegistryConfig) -> datetime:
    """When ``champion`` (models:/NAME/VERSION) took the alias: when a person approved it, else when it
    was registered (an unapproved promotion moves the alias as the version is made)."""
    mv = resolve_version(champion, reg)
    made = datetime.fromtimestamp(mv.creation_timestamp / 1000, UTC)
    if mv.tags.get(TAG) == "approved":
        try:
            return max(made, _utc(mv.tags[AT_TAG]))
        except (KeyError, ValueError):
            pass
    return made


def _utc(text: str) -> datetime:
    at = datetime.fromisoformat(text)
    return at if at.tzinfo else at.replace(tzinfo=UTC)  # written without a zone (another system's marker): UTC


def _landed(batch: Any) -> datetime:
    return _utc(batch.landed_at)


def stale(cfg: RunConfig, plan: RefreshPlan, dag_id: str, run_id: str, now: datetime) -> list[Alert]:
    """The stale-champion alert, when it is due and this period has not had it."""
    max_age, waiting = cfg.refresh.max_age_s, sorted([*plan.new, *plan.held], key=_landed)
    if max_age is None or plan.champion is None or not waiting:
        return []
    since = champion_since(plan.champion, cfg.registry)
    stale_for = (now - max(since, _landed(waiting[0]))).total_seconds()
    if stale_for <= max_age or not claim(f"champion_stale {plan.champion} {int(stale_for // max_age)}"):
        return []
    return [Alert("champion_stale", dag_id, run_id,
                  f"champion {plan.champion} (since {since.isoformat(timespec='seconds')}) is not refreshed "
                  f"{span(stale_for)} after batch {waiting[0].id} landed, past refresh.max_age_s "
                  f"({span(max_age)}); {len(waiting)} batch(es) wait: {_named([b.id for b in waiting])}")]


def after_plan(cfg: RunConfig, run_dir: Path, dag_id: str, run_id: str, now: datetime | None = None) -> list[Alert]:
    """Send the alerts this refresh's plan (``refresh/plan.json`` in ``run_dir``) calls for; returns
    them. Never raises: an alert is a courtesy beside the refresh, which goes on either way."""
    if not (cfg.alerts.email or cfg.alerts.webhooks):
        return []
    try:
        plan = RefreshPlan.load(run_dir)
        found = quarantined(plan, dag_id, run_id) + stale(cfg, plan, dag_id, run_id, now or datetime.now(UTC))
    except Exception as exc:
        log.warning("the refresh's alerts were not checked: %s", why(exc))
        return []
    for alert in found:
        deliver(alert, cfg.alerts)
    return found
