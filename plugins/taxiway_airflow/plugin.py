"""The Taxiway Airflow plugin: the "Training runs" view in the api-server and its entry in the
Airflow UI's navigation.

Registered once: by the installed package's ``airflow.plugins`` entry point (pyproject.toml), or, where
the package is not installed and ``plugins/`` is only Airflow's plugins folder, by
``plugins/taxiway_plugin.py``, which exposes this class only then. Not in the provider info's
``plugins``: Airflow loads those only with ``[core] lazy_discover_providers = False``, and then as a
second copy of the entry point's, which it refuses with an import error.

Airflow imports this file in every component that loads plugins, so it imports nothing heavy: the
FastAPI app (and with it the view's modules) is built on its first request, in the api-server only.
The extra links on the train, evaluate and register tasks need no registration here: they are on
the operators themselves (``taxiway_airflow.links``) and Airflow stores their URLs as XComs. The one
listener sets MLflow's credentials in each task process from the ``mlflow_default`` connection.
"""

from __future__ import annotations

from typing import Any

from airflow.plugins_manager import AirflowPlugin

from taxiway_airflow import mlflow_connection
from taxiway_airflow.trigger_guard import TriggerConfGuard

URL_PREFIX = "/taxiway"


class LazyApp:
    """An ASGI app that builds the view's FastAPI app when the first request arrives."""

    def __init__(self) -> None:
        self._app: Any = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if self._app is None:
            # the view's app (~2 s): api-server only, first request
            from taxiway_airflow.runs_view.app import create_app

            self._app = create_app()
        await self._app(scope, receive, send)


class TaxiwayPlugin(AirflowPlugin):
    name = "taxiway"
    listeners = [mlflow_connection]
    fastapi_apps = [{"app": LazyApp(), "url_prefix": URL_PREFIX, "name": "Taxiway training runs"}]
    fastapi_root_middlewares = [{"middleware": TriggerConfGuard, "name": "Taxiway trigger conf guard"}]
    external_views = [
        {"name": "Training runs", "href": f"{URL_PREFIX}/runs", "destination": "nav", "url_route": "training-runs",
         "category": "browse", "nav_top_level": True},
        # a tab on every DAG run's page (the UI fills in {DAG_ID} and {RUN_ID}); other DAGs' runs get a 404 line
        {"name": "Training", "href": f"{URL_PREFIX}/runs/{{DAG_ID}}/{{RUN_ID}}", "destination": "dag_run",
         "url_route": "taxiway-run"},
    ]
