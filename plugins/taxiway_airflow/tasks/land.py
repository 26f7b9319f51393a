"""The task of ``taxiway_land``: a folder landed as a batch of the deployment's landing zone, and
announced as an event of the landing asset, which is what starts ``taxiway_refresh``."""

from __future__ import annotations

import logging
from typing import Any

from airflow.sdk import get_current_context, task

from pipelines.config import deployment
from pipelines.refresh import landing
from pipelines.refresh.announce import event_extra
from pipelines.roots import Roots
from taxiway_airflow import intake
from taxiway_airflow.failures import translated
from taxiway_airflow.tasks.common import TASK

log = logging.getLogger("taxiway")


@task(**TASK)
@translated
def land_batch(source: str, batch_id: str | None) -> dict[str, Any]:
    """Land the folder ``source`` as a batch of the deployment's landing zone; the task's outlet (the
    landing asset, set by the DAG) is what starts ``taxiway_refresh``. A retry after the batch
    landed finds it complete and announces it again instead of landing it twice."""
    ctx = get_current_context()
    intake.resolve(intake.LAND, ctx["dag_run"].conf or {})  # a run made by any route: REST, form, materialize
    roots = Roots.from_env()
    cfg = deployment.config()
    zone = cfg.refresh.landing
    if not zone:
        raise landing.LandingError("refresh.landing: not set in the deployment's config; nowhere to land")
    (outlet,) = [a for a in ctx["task"].outlets if getattr(a, "name", None) == landing.ASSET_NAME]
    if outlet.uri != landing.asset_uri(zone):
        raise landing.LandingError(f"refresh.landing is {zone} where this task runs, but the DAG was parsed with "
                                   f"{outlet.uri}: the worker and the DAG processor must read one config")
    roots.check_data({"source": source})
    batch_id = batch_id or ctx["run_id"].replace(":", "").replace("+", "")
    earlier = [b for b in landing.scan(zone)[0] if b.id == batch_id] if ctx["ti"].try_number > 1 else []
    batch = earlier[0] if earlier else landing.land(source, zone, batch_id, fmt=cfg.data.format, limits=cfg.limits)
    log.info("batch %s %s in %s: %d file(s), manifest sha256 %s", batch.id, "was landed by an earlier try" if earlier
             else "landed", zone, batch.files, batch.manifest_sha256)
    ctx["outlet_events"][outlet].extra = event_extra(batch)
    return event_extra(batch)
