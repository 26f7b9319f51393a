"""Taxiway as an installable Airflow provider (``taxiway_airflow``, packaged from ``plugins/``): the
provider info Airflow reads through the ``apache_airflow_provider`` entry point, checked against
Airflow's own schema; every class it names imports; ``airflow providers`` lists it from the installed
package; the views' plugin is registered exactly once whether or not the plugins folder is set; and
the deployment's queue and pool reach the tasks that need them (docs/deploy.md)."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import inspect
import json
import os
import runpy
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import jsonschema
import pytest
import services

from conftest import BIN, REPO
from taxiway_airflow.get_provider_info import CONFIG, PACKAGE, get_provider_info

AIRFLOW_SCHEMA = Path(importlib.util.find_spec("airflow").origin).parent / "provider_info.schema.json"


def _airflow_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The project's environment with an Airflow home of the test's own."""
    home = tmp_path / "airflow-home"
    home.mkdir(exist_ok=True)
    return {**os.environ, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False", **extra}


def _json_tail(stdout: str) -> list[dict]:
    """The JSON list an ``airflow … -o json`` command prints (after any log lines)."""
    return json.loads(stdout[stdout.index("["):])


# --- the provider info ----------------------------------------------------------------------------

def test_the_provider_info_validates_against_airflows_schema():
    from airflow.providers_manager import _create_provider_info_schema_validator

    info = get_provider_info()
    jsonschema.validate(info, json.loads(AIRFLOW_SCHEMA.read_text()))
    _create_provider_info_schema_validator().validate(info)  # the validator Airflow itself runs
    assert info["package-name"] == PACKAGE and info["versions"] == [importlib.metadata.version(PACKAGE)]
    (conn,) = info["connection-types"]  # the connection form, as Airflow converts and checks it
    behaviour = conn["ui-field-behaviour"]
    jsonschema.validate({k.replace("-", "_"): v for k, v in behaviour.items()},
                        json.loads((AIRFLOW_SCHEMA.parent / "customized_form_field_behaviours.schema.json").read_text()))
    names = {i["integration-name"] for i in info["integrations"]}
    for key in ("operators", "sensors", "hooks", "triggers"):
        assert {entry["integration-name"] for entry in info[key]} <= names, key


def test_a_broken_provider_info_fails_the_schema():
    """The check above can fail: Airflow refuses these, and with them every ``airflow`` command."""
    validate = json.loads(AIRFLOW_SCHEMA.read_text())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({k: v for k, v in get_provider_info().items() if k != "description"}, validate)
    broken = get_provider_info()
    broken["config"]["taxiway"]["options"]["gpu_queue"]["type"] = "queue"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, validate)


def test_every_module_and_class_the_provider_info_names_imports():
    from airflow.sdk import BaseHook, BaseNotifier, BaseOperator, BaseSensorOperator
    from airflow.triggers.base import BaseTrigger

    info = get_provider_info()
    kinds = {"operators": BaseOperator, "sensors": BaseSensorOperator, "triggers": BaseTrigger}
    for key in ("operators", "sensors", "hooks", "triggers"):
        for module_name in (m for entry in info[key] for m in entry["python-modules"]):
            module = importlib.import_module(module_name)
            if key in kinds:  # each such module defines at least one of its kind
                own = [c for _, c in inspect.getmembers(module, inspect.isclass)
                       if c.__module__ == module_name and issubclass(c, kinds[key])]
                assert own, f"{module_name}: no {kinds[key].__name__} defined there"
    for conn in info["connection-types"]:
        module_name, _, name = conn["hook-class-name"].rpartition(".")
        hook = getattr(importlib.import_module(module_name), name)
        assert issubclass(hook, BaseHook) and hook.conn_type == conn["connection-type"]
        assert hook.hook_name == conn["hook-name"] and hook.default_conn_name == "mlflow_default"
    for path in info["notifications"]:
        module_name, _, name = path.rpartition(".")
        assert issubclass(getattr(importlib.import_module(module_name), name), BaseNotifier)


def test_every_operator_hook_sensor_and_trigger_module_is_listed():
    """A new module under operators/, hooks/, sensors/ or triggers/ is listed, or the provider hides it."""
    info = get_provider_info()
    listed = {m for key in ("operators", "sensors", "hooks", "triggers") for e in info[key] for m in e["python-modules"]}
    package = REPO / "plugins" / "taxiway_airflow"
    present = {f"taxiway_airflow.{folder}.{p.stem}" for folder in ("operators", "sensors", "hooks", "triggers")
               for p in (package / folder).glob("*.py") if p.stem != "__init__"}
    assert listed == present


def test_the_config_defaults_are_the_codes_fallbacks():
    """Airflow loads the provider's defaults into its config: each must be what the code falls back to."""
    from airflow.configuration import conf

    from taxiway_airflow import placement
    from taxiway_airflow.sensors.checkpoint import POKE_INTERVAL_S
    from taxiway_airflow.triggers.gang import MIN_EVENT_DELAY_S

    options = CONFIG["taxiway"]["options"]
    assert set(options) == {"min_event_delay_s", "checkpoint_poke_s", placement.GPU_QUEUE, placement.REGISTRY_POOL,
                            placement.GANG_RETRY_DELAY}
    assert float(options[placement.GANG_RETRY_DELAY]["default"]) == placement.GANG_RETRY_DELAY_S
    assert float(options["min_event_delay_s"]["default"]) == MIN_EVENT_DELAY_S
    assert float(options["checkpoint_poke_s"]["default"]) == POKE_INTERVAL_S
    assert options["gpu_queue"]["default"] == options["registry_pool"]["default"] == ""
    for key, option in options.items():  # as Airflow reads them (conftest sets two for dag.test() runs)
        if f"AIRFLOW__TAXIWAY__{key.upper()}" not in os.environ:
            assert conf.get("taxiway", key) == option["default"], key
    assert placement.gpu_work() == {} and placement.registry_work() == {}  # the defaults change nothing


# --- installed: entry points, the wheel, the airflow CLI -----------------------------------------------

def test_the_installed_distribution_registers_the_provider_and_the_plugin():
    # every distribution, as Airflow reads them (an older taxiway.egg-info in the working directory may come first)
    points = {(ep.group, ep.name): ep.value for dist in importlib.metadata.distributions()
              if dist.metadata["Name"] == PACKAGE for ep in dist.entry_points}
    assert points[("apache_airflow_provider", "provider_info")] == "taxiway_airflow.get_provider_info:get_provider_info"
    assert points[("airflow.plugins", "taxiway")] == "taxiway_airflow.plugin:TaxiwayPlugin"
    import taxiway_airflow  # one package, one folder: the plugins folder's and the installed one are the same

    assert Path(taxiway_airflow.__file__).resolve() == (REPO / "plugins" / "taxiway_airflow" / "__init__.py").resolve()


def test_the_wheel_carries_the_package_and_both_entry_points(tmp_path: Path):
    """What ``pip install .`` (docker/airflow.Dockerfile) installs: every module of taxiway_airflow, the
    entry points, and not the plugins folder's own file. Built from a copy of the sources (pip builds
    in-tree)."""
    src = tmp_path / "src"
    for name in ("pyproject.toml", "README.md"):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, src / name)
    for name in ("pipelines", "trainer", "eval", "plugins"):
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([str(BIN / "pip"), "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
                    "-w", str(tmp_path / "wheel"), str(src)], check=True, capture_output=True, timeout=240)
    (wheel,) = (tmp_path / "wheel").glob("taxiway-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    package = REPO / "plugins" / "taxiway_airflow"
    modules = {f"taxiway_airflow/{p.relative_to(package).as_posix()}" for p in package.rglob("*.py")
               if "__pycache__" not in p.parts}
    assert modules <= names and "taxiway_airflow/get_provider_info.py" in modules, sorted(modules - names)
    assert not any(n.startswith(("plugins/", "taxiway_plugin")) for n in names)
    points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    assert "[apache_airflow_provider]" in points and "taxiway = taxiway_airflow.plugin:TaxiwayPlugin" in points


def test_airflow_lists_the_provider_its_connection_type_and_its_config(tmp_path: Path):
    env = _airflow_env(tmp_path)
    airflow = str(BIN / "airflow")

    def run(*args: str) -> str:
        return subprocess.run([airflow, *args], env=env, capture_output=True, text=True, check=True, timeout=180).stdout

    (listed,) = [p for p in _json_tail(run("providers", "list", "-o", "json")) if p["package_name"] == PACKAGE]
    assert listed["version"] == importlib.metadata.version(PACKAGE) and listed["description"].startswith("Train")
    (hook,) = [h for h in _json_tail(run("providers", "hooks", "-o", "json")) if h["connection_type"] == "mlflow"]
    assert hook == {"connection_type": "mlflow", "class": "taxiway_airflow.hooks.mlflow.MlflowHook",
                    "conn_id_attribute_name": "mlflow_conn_id", "package_name": PACKAGE,
                    "hook_name": "MLflow tracking server"}
    assert {"field_behaviours": "mlflow"} in _json_tail(run("providers", "behaviours", "-o", "json"))
    assert run("config", "get-value", "taxiway", "min_event_delay_s").strip() == os.environ.get(
        "AIRFLOW__TAXIWAY__MIN_EVENT_DELAY_S", "10.0")


# --- the views' plugin: registered once -----------------------------------------------------------

PLUGINS_PROBE = """
import json
from airflow import plugins_manager
from airflow.sdk import plugins_manager as task_plugins
core, core_errors = plugins_manager._get_plugins()
task, task_errors = task_plugins._get_plugins()
print(json.dumps({"core": [[p.name, str(p.source)] for p in core], "core_errors": core_errors,
                  "task": [p.name for p in task], "task_errors": task_errors}))
"""


@pytest.mark.parametrize("setting", ["plugins folder", "no plugins folder", "providers discovered eagerly"])
def test_the_views_plugin_is_registered_once(tmp_path: Path, setting: str):
    """From the entry point, with the repo's plugins folder (whose ``taxiway_plugin.py`` then stays
    silent) or without it, and when providers are discovered eagerly (the provider info names no
    plugin: it would be a second copy); in the api-server's plugin manager and the task SDK's."""
    extra = {"AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins")}
    if setting == "no plugins folder":
        (tmp_path / "empty").mkdir()
        extra = {"AIRFLOW__CORE__PLUGINS_FOLDER": str(tmp_path / "empty")}
    elif setting == "providers discovered eagerly":
        extra["AIRFLOW__CORE__LAZY_DISCOVER_PROVIDERS"] = "False"
    out = subprocess.run([sys.executable, "-c", PLUGINS_PROBE], env=_airflow_env(tmp_path, **extra),
                         capture_output=True, text=True, check=True, timeout=180).stdout
    seen = json.loads(out.strip().splitlines()[-1])
    assert [p for p in seen["core"] if p[0] == "taxiway"] == [
        ["taxiway", f"taxiway=={importlib.metadata.version(PACKAGE)}: EntryPoint(name='taxiway', "
                    "value='taxiway_airflow.plugin:TaxiwayPlugin', group='airflow.plugins')"]]
    assert seen["task"].count("taxiway") == 1
    assert seen["core_errors"] == {} and seen["task_errors"] == {}


def test_the_plugins_folder_file_registers_the_plugin_only_where_the_package_is_not_installed(
        monkeypatch: pytest.MonkeyPatch):
    from taxiway_airflow.plugin import TaxiwayPlugin

    shim = str(REPO / "plugins" / "taxiway_plugin.py")
    assert "TaxiwayPlugin" not in runpy.run_path(shim)  # installed: the entry point registers it
    monkeypatch.setattr(importlib.metadata, "distributions", lambda **_: [])
    assert runpy.run_path(shim)["TaxiwayPlugin"] is TaxiwayPlugin  # a plugins folder alone


# --- queues and pools -----------------------------------------------------------------------------

GPU_TASKS = {"taxiway_train": {"train.smoke", "train.gang", "evaluate.score"},
             "taxiway_refresh": {"train.smoke", "train.gang", "evaluate.score"},
             "taxiway_sweep": {"sweep.member.smoke", "sweep.member.gang", "sweep.member.score"},
             "taxiway_land": set()}
REGISTRY_TASKS = {"taxiway_train": {"register.model_version", "register.decision"},
                  "taxiway_refresh": {"register.model_version", "register.decision"},
                  "taxiway_sweep": {"register.model_version", "register.decision"},
                  "taxiway_land": set()}


def _placement() -> dict[str, dict[str, tuple[str, str]]]:
    """Each Taxiway DAG's tasks: {task id: (queue, pool)}, parsed now (the settings are read at parse)."""
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {} and set(bag.dags) == set(GPU_TASKS)
    return {dag_id: {t.task_id: (t.queue, t.pool) for t in dag.tasks} for dag_id, dag in bag.dags.items()}


def test_by_default_every_task_keeps_airflows_default_queue_and_pool(monkeypatch: pytest.MonkeyPatch):
    from airflow.configuration import conf

    monkeypatch.setenv("TAXIWAY_LAUNCHER", "local")
    default = (conf.get("operators", "default_queue"), "default_pool")
    for dag_id, tasks in _placement().items():
        assert set(tasks.values()) == {default}, dag_id


@pytest.mark.parametrize("launcher", ["local", "kubernetes"])
def test_the_deployment_puts_gpu_work_on_its_queue_and_registrations_in_its_pool(
        monkeypatch: pytest.MonkeyPatch, launcher: str):
    from airflow.configuration import conf

    monkeypatch.setenv("TAXIWAY_LAUNCHER", launcher)
    monkeypatch.setenv("AIRFLOW__TAXIWAY__GPU_QUEUE", "gpu")
    monkeypatch.setenv("AIRFLOW__TAXIWAY__REGISTRY_POOL", "taxiway_registry")
    default_queue = conf.get("operators", "default_queue")
    for dag_id, tasks in _placement().items():
        gpu = set(GPU_TASKS[dag_id])
        if launcher == "kubernetes":  # the Job's pods do the work; the task only watches them (deferred)
            gpu -= {"train.gang", "sweep.member.gang"}
        assert {t for t, (queue, _) in tasks.items() if queue == "gpu"} == gpu, dag_id
        assert {q for t, (q, _) in tasks.items() if t not in gpu} == {default_queue}, dag_id
        assert {t for t, (_, pool) in tasks.items() if pool == "taxiway_registry"} == REGISTRY_TASKS[dag_id], dag_id
        assert {p for t, (_, p) in tasks.items() if t not in REGISTRY_TASKS[dag_id]} == {"default_pool"}, dag_id


MISSING_POOL_DAG = """
import datetime
from airflow.sdk import dag, task

@dag(schedule=None, start_date=datetime.datetime(2024, 1, 1))
def taxiway_missing_pool_probe():
    @task(pool="taxiway_no_such_pool", queue="gpu")
    def step():
        return 1

    step()

probe = taxiway_missing_pool_probe()
if __name__ == "__main__":
    import json
    run = probe.test()
    (ti,) = run.get_task_instances()
    print(json.dumps([run.state, ti.state, ti.pool, ti.queue]))
"""


def test_dag_test_runs_a_task_whose_pool_does_not_exist(airflow_db: Path, tmp_path: Path):
    """What the dag.test() suites rely on when a deployment names a pool: ``dag.test()`` runs tasks without
    the scheduler's pool check (a live scheduler never queues them: 'Tasks using non-existent pool').
    In an Airflow of its own (a copy of the session's freshly migrated database), whose DAG folder holds the probe only."""
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "probe.py").write_text(MISSING_POOL_DAG)
    env = _airflow_env(tmp_path, AIRFLOW__CORE__DAGS_FOLDER=str(dags))
    shutil.copyfile(services.session_dir() / "airflow-migrated.db", Path(env["AIRFLOW_HOME"]) / "airflow.db")
    done = subprocess.run([sys.executable, str(dags / "probe.py")], env=env, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == ["success", "success", "taxiway_no_such_pool", "gpu"]
