"""The plugins-folder route to the Taxiway plugin (``taxiway_airflow.plugin``: the "Training runs" view,
the trigger conf guard, the MLflow connection listener), for an Airflow whose plugins folder is
``plugins/`` but which has not installed this project.

Installed (``pip install``, as the Makefile's venv and docker/airflow.Dockerfile do), the package's
``airflow.plugins`` entry point registers the plugin; this file then exposes no plugin class, so Airflow
registers it once (a second ``taxiway`` plugin is refused and reported as an import error).
"""

from __future__ import annotations

from importlib.metadata import distributions

GROUP, ENTRY_POINT = "airflow.plugins", "taxiway_airflow.plugin:TaxiwayPlugin"  # pyproject.toml


def installed() -> bool:
    """Whether an installed distribution registers the plugin through its entry point. Every
    distribution on ``sys.path`` is asked, as Airflow's plugin loader asks them: ``entry_points()``
    keeps the first of each name, and an older ``taxiway.egg-info`` found first would hide the entry
    point from this check but not from Airflow."""
    return any(ep.group == GROUP and ep.value == ENTRY_POINT for dist in distributions() for ep in dist.entry_points)


if not installed():
    from taxiway_airflow.plugin import TaxiwayPlugin

    __all__ = ["TaxiwayPlugin"]
