"""The landing zone as an Airflow asset: what ``taxiway_refresh`` is scheduled on and what
``taxiway land`` announces."""

from __future__ import annotations

from airflow.sdk import Asset

from pipelines.refresh.landing import ASSET_NAME, asset_uri


def landing_asset(landing: str | None):
    if not landing:
        raise ValueError("refresh.landing is not set in the config this DAG is parsed with (TAXIWAY_CONFIG)")
    return Asset(name=ASSET_NAME, uri=asset_uri(landing))
