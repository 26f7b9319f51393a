"""What a trigger sends, checked in one place and one order (docs/security.md): size and depth, then
known keys (``params.check_conf``), then the fields only the deployment sets, the schema's bounds and
the deployment's limits on the resolved config (``deployment.load_triggered``). The api-server's guard
runs it before a run exists (400, naming each key), and every DAG's first task runs it again, for a run
made by a route no guard sees; the first task then holds the data paths to the data roots, which the
api-server does not read."""

from __future__ import annotations

from typing import Any

from pipelines.config import RunConfig, deployment
from pipelines.errors import BadInput
from pipelines.roots import Roots
from taxiway_airflow.params import check_conf, overrides_from_conf

LAND = "taxiway_land"
LAND_KEYS = ("source", "batch_id")  # taxiway_land's params, all its conf may hold
OWN_KEYS = {"taxiway_sweep": ("sweep",)}  # a DAG's own keys beside the run config's


def resolve(dag_id: str, conf: dict[str, Any]) -> RunConfig | None:
    """The run config ``conf`` asks of ``dag_id`` (None for taxiway_land, which has no run config);
    ``BadInput`` (a ``ConfigError`` naming each key) for anything refused."""
    if dag_id == LAND:
        check_conf(conf, keys=LAND_KEYS)
        return None
    own = OWN_KEYS.get(dag_id, ())
    check_conf(conf, extra_keys=own)
    run = {k: v for k, v in conf.items() if k not in own}
    return deployment.load_triggered(run.get("config") or None, overrides_from_conf(run), list(run.get("set") or []),
                                     Roots.from_env())


def refusals(dag_id: str, conf: dict[str, Any]) -> list[tuple[str, str]]:
    """(key, why) for each thing ``resolve`` refuses; empty when ``conf`` makes a run config."""
    try:
        resolve(dag_id, conf)
    except BadInput as exc:
        return list(getattr(exc, "errors", {"config": str(exc)}).items())
    return []
