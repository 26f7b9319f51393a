"""What every Taxiway task module uses: the ``@task`` settings, the run folder and its config, and the
run's config from its trigger's ``conf``.

A task's run folder is derived from its DAG run (DAG id, run id), never read from an XCom: a user who
may edit XComs could otherwise point every later task at another folder. The ``run`` XCom a task
receives wires the DAG and, for a sweep member, names the member's index, which is checked against
the sweep's own list. The config in that folder is held to the deployment's (``run_config``)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from airflow.sdk import get_current_context

from pipelines import run_folder
from pipelines.config import RunConfig, deployment
from pipelines.refresh.plan import RefreshPlan, judged_as_refresh
from pipelines.roots import Roots, data_values
from pipelines.run_folder import RunFolder
from pipelines.stages.prepare import load_run_config, prepare
from pipelines.sweep import members as sweep_members
from taxiway_airflow import intake
from taxiway_airflow.failures import RETRY

log = logging.getLogger("taxiway")
TRAIN = "taxiway_train"  # whose conf every run config's is (refresh and sweep take the same keys)

# every Taxiway @task: retried with the back-off of RETRY; a returned dict is one XCom, since its
# consumers take it whole (Airflow infers multiple_outputs from a dict annotation and would push each
# key too: one more execution-API call and database write per key, on every mapped shard)
TASK: dict[str, Any] = {"retries": 2, **RETRY, "multiple_outputs": False}


def own_dir() -> Path:
    """The running task's DAG run's folder."""
    ctx = get_current_context()
    return run_folder.run_dir(ctx["dag"].dag_id, ctx["run_id"])


def run_dir_of(run: dict[str, Any]) -> Path:
    """The folder of the run this task works for: its DAG run's, or the sweep member's the ``run`` XCom
    names by index (one the sweep listed)."""
    own = own_dir()
    return own if "member" not in run else sweep_members.member_dir(own, run["member"])


def approval_dir() -> Path:
    """The folder whose registration waits for approval: the DAG run's own or, in a sweep, its best
    member's (as the sweep's own ``registry.json`` names it by index)."""
    own = own_dir()
    record = RunFolder(own).registry_record
    member = json.loads(record.read_text()).get("sweep_member") if record.exists() else None
    return own if member is None else sweep_members.member_dir(own, member)


def run_key_of(run: dict[str, Any], dag_id: str, run_id: str) -> str:
    """The MLflow run a training gang's metrics go to: the Airflow run's, or a sweep member's own."""
    key = run_folder.run_key(dag_id, run_id)
    if "member" not in run:
        return key
    return sweep_members.member_key(key, int(sweep_members.member_dir(run_folder.run_dir(dag_id, run_id),
                                                                     run["member"]).name))


def run_config(run_dir: Path) -> RunConfig:
    """The config in ``run_dir``, refused where a deployment-owned field differs from the deployment's
    config (as a refresh judges it, in a refresh's folder)."""
    expected = deployment.config()
    if RefreshPlan.of_run(run_dir) is not None:
        expected = judged_as_refresh(expected, run_dir)
    return deployment.check_run(load_run_config(run_dir), expected, str(RunFolder(run_dir).config))


def conf_config(conf: dict[str, Any]) -> RunConfig:
    """The run's config from its trigger's ``conf``: the deployment's config (or the file the conf
    names, where the deployment lets it: ``load_triggered``), the conf's sections and form fields (``params.overrides_from_conf``: what differs
    from the form's defaults) and ``set`` overlaid as values, refused where only the deployment sets a
    field; every data path checked against the data roots."""
    return held_to_roots(intake.resolve(TRAIN, conf))


def held_to_roots(cfg: RunConfig) -> RunConfig:
    """``cfg`` once every data path in it is inside the data roots (which the api-server does not read)."""
    Roots.from_env().check_data(data_values(cfg))
    return cfg


def prepared(cfg: RunConfig, run_dir: Path) -> dict[str, Any]:
    """``config.yaml`` written into ``run_dir``; the ``run`` XCom every later task receives (what it
    shows is for people: no task takes a path or a setting from it)."""
    prepare(cfg, run_dir)
    log.info("run folder %s, config sha256 %s", run_dir, cfg.sha256())
    return {"config_sha256": cfg.sha256(), "name": cfg.name}
