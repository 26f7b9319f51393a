"""What every Taxiway task module uses: the ``@task`` settings, the run folder from the XCom a task
receives, and the run's config from its trigger's ``conf``."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from pipelines import run_folder
from pipelines.config import RunConfig
from pipelines.config.load import load_triggered
from pipelines.roots import DATA_FIELDS, Roots
from pipelines.stages.prepare import prepare
from taxiway_airflow.failures import RETRY
from taxiway_airflow.params import check_conf, default_config_path, overrides_from_conf

log = logging.getLogger("taxiway")

# every Taxiway @task: retried with the back-off of RETRY; a returned dict is one XCom, since its
# consumers take it whole (Airflow infers multiple_outputs from a dict annotation and would push each
# key too: one more execution-API call and database write per key, on every mapped shard)
TASK: dict[str, Any] = {"retries": 2, **RETRY, "multiple_outputs": False}


def run_dir_of(run: dict[str, Any]) -> Path:
    """The run folder named by the ``run`` XCom (``prepared``'s)."""
    return Path(run["run_dir"])


def run_key_of(run: dict[str, Any], dag_id: str, run_id: str) -> str:
    """The MLflow run a training gang's metrics go to: the Airflow run's, or a sweep member's own (its
    ``run`` XCom names it)."""
    return run.get("run_key") or run_folder.run_key(dag_id, run_id)


def _field(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def conf_config(conf: dict[str, Any]) -> RunConfig:
    """The run's config from its trigger's ``conf``: the config file the conf names (or the
    deployment's), the conf's sections and form fields (``params.overrides_from_conf``: what differs
    from the form's defaults) and ``set`` overlaid as values, refused where only the deployment sets a
    field; every data path checked against the data roots."""
    roots = Roots.from_env()
    check_conf(conf)
    path = roots.config_file(conf.get("config") or default_config_path())
    cfg = load_triggered(path, overrides_from_conf(conf), list(conf.get("set") or []), roots)
    roots.check_data({f: _field(cfg, f) for f in DATA_FIELDS})
    return cfg


def prepared(cfg: RunConfig, run_dir: Path) -> dict[str, Any]:
    """``config.yaml`` written into ``run_dir``; the ``run`` XCom every later task receives."""
    prepare(cfg, run_dir)
    log.info("run folder %s, config sha256 %s", run_dir, cfg.sha256())
    return {"run_dir": str(run_dir), "config_sha256": cfg.sha256(), "name": cfg.name}
