"""What a trigger sends, checked in one place and one order (docs/security.md): size and depth, then
known keys (``params.check_conf``), then the fields only the deployment sets, the schema's bounds and
the deployment's limits on the resolved config (``deployment.load_triggered``). The api-server's guard
runs it before a run exists (400, naming each key), and every DAG's first task runs it again, for a run
made by a route no guard sees; the first task then holds the data paths to the data roots, which the
api-server does not read."""

from __future__ import annotations

from typing import Any

from pipelines.config import ConfigError, RunConfig, deployment
from pipelines.errors import BadInput
from pipelines.roots import Roots
from pipelines.sweep import points
from taxiway_airflow.params import check_conf, overrides_from_conf

LAND = "taxiway_land"
LAND_KEYS = ("source", "batch_id")  # taxiway_land's params, all its conf may hold
SWEEP = "taxiway_sweep"
OWN_KEYS = {SWEEP: ("sweep",)}  # a DAG's own keys beside the run config's


def resolve(dag_id: str, conf: dict[str, Any]) -> RunConfig | None:
    """The run config ``conf`` asks of ``dag_id`` (None for taxiway_land, which has no run config);
    ``BadInput`` (a ``ConfigError`` naming each key) for anything refused."""
    if dag_id == LAND:
        check_conf(conf, keys=LAND_KEYS)
        return None
    if dag_id == SWEEP:
        return sweep(conf)[0]
    return _run_config(dag_id, conf)


def sweep(conf: dict[str, Any]) -> tuple[RunConfig, list[points.Member]]:
    """A sweep's run config and its members: every point held to what a trigger may set (never a
    deployment-owned field), the schema and ``limits.sweep_members``, by point and key."""
    if "sweep" not in conf:
        raise ConfigError({"sweep": "missing; send a grid ({\"train.lr\": [0.001, 0.0003]}) or a list of points"},
                          "conf")
    cfg = _run_config(SWEEP, conf)
    return cfg, points.members(cfg, conf["sweep"])


def _run_config(dag_id: str, conf: dict[str, Any]) -> RunConfig:
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
