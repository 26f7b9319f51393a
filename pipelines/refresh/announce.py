"""Tell Airflow a batch landed: an asset event on the landing zone, which ``taxiway_refresh`` is
scheduled on, sent with the official REST client (``apache-airflow-client``).

Configured from the environment only, so no secret sits in a config: ``TAXIWAY_AIRFLOW_URL`` (the
api-server's base URL) and either ``TAXIWAY_AIRFLOW_TOKEN`` (an API token) or
``TAXIWAY_AIRFLOW_USERNAME`` + ``TAXIWAY_AIRFLOW_PASSWORD`` (exchanged at ``/auth/token``). Without a
URL nothing is sent and the refresh's cron finds the batch instead.
"""

from __future__ import annotations

import json
import os
import urllib.request
from typing import Any

from pipelines.errors import BadInput, Transient
from pipelines.refresh.landing import Batch, asset_uri

URL, TOKEN, USER, PASSWORD = ("TAXIWAY_AIRFLOW_URL", "TAXIWAY_AIRFLOW_TOKEN", "TAXIWAY_AIRFLOW_USERNAME",
                              "TAXIWAY_AIRFLOW_PASSWORD")


class NotAnnounced(Transient):
    """The batch landed, but Airflow was not told (the cron will still find it)."""


def configured() -> bool:
    return bool(os.environ.get(URL))


def check() -> None:
    """Credentials are there when a URL is (checked before anything lands)."""
    if configured() and not os.environ.get(TOKEN) and not (os.environ.get(USER) and os.environ.get(PASSWORD)):
        raise BadInput(f"{URL} is set but no credentials: set {TOKEN}, or {USER} and {PASSWORD}")


def token(url: str, timeout_s: float = 30) -> str:
    """An API token for the api-server at ``url``, from the environment (see above)."""
    check()
    if os.environ.get(TOKEN):
        return os.environ[TOKEN]
    body = json.dumps({"username": os.environ[USER], "password": os.environ[PASSWORD]}).encode()
    request = urllib.request.Request(f"{url}/auth/token", body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            return json.loads(resp.read())["access_token"]
    except OSError as exc:
        raise NotAnnounced(f"could not log in to {url}/auth/token as {os.environ[USER]}: {exc}") from None


def event_extra(batch: Batch) -> dict[str, Any]:
    """What an asset event of the landing zone says about the batch it announces."""
    return {"batch_id": batch.id, "manifest_sha256": batch.manifest_sha256, "files": batch.files}


def announce(batch: Batch, landing: str) -> dict[str, Any]:
    """Post the asset event (``extra`` names the batch); returns what Airflow recorded."""
    import airflow_client.client as af  # airflow_client (~0.8 s): DAG parse must not pay for it
    from urllib3.exceptions import HTTPError  # urllib3 (~50 ms): only with airflow_client above

    url = os.environ[URL].rstrip("/")
    uri = asset_uri(landing)
    api = af.ApiClient(af.Configuration(host=url, access_token=token(url)))
    try:
        assets = af.AssetApi(api).get_assets(uri_pattern=uri).assets
        match = [a for a in assets if a.uri == uri]
        if not match:
            raise NotAnnounced(f"Airflow at {url} knows no asset {uri}: is taxiway_refresh parsed with "
                               f"refresh.landing = {landing}?")
        event = af.AssetApi(api).create_asset_event(af.CreateAssetEventsBody(asset_id=match[0].id,
                                                                             extra=event_extra(batch)))
    except af.ApiException as exc:
        raise NotAnnounced(f"Airflow at {url} refused the asset event for {uri}: HTTP {exc.status} {exc.reason}") from None
    except (OSError, HTTPError) as exc:
        raise NotAnnounced(f"could not reach Airflow at {url}: {type(exc).__name__}") from None
    return {"id": event.id, "asset": uri, "timestamp": event.timestamp.isoformat()}
