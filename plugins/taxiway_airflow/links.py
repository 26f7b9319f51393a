"""Extra links on the train, evaluate and register tasks: the MLflow run, the model version, the
eval report.

Airflow 3 computes an operator's links on the worker when the task ends (``finalize`` in the task
runner) and stores each URL as an XCom, which the api-server shows without importing this module
(``XComOperatorLink``). So ``get_link`` here must be cheap and must not fail: it only checks that
the run folder holds what the link leads to (else ``""``, a disabled button) and points at a route
of the Taxiway plugin (``/taxiway/go/…``) that resolves the target when clicked — the MLflow run id
may not exist yet when training ends, and the MLflow UI's address is the api-server's to know.
"""

from __future__ import annotations

from typing import Any, ClassVar
from urllib.parse import quote

from airflow.sdk import BaseOperatorLink
from airflow.sdk.configuration import conf

from pipelines.run_folder import RunFolder, run_dir

ROUTE = "/taxiway"  # where the plugin mounts its FastAPI app (plugin.py)


def airflow_base() -> str:
    """The api-server's public address (``[api] base_url``); empty means links stay relative to it."""
    return (conf.get("api", "base_url", fallback="") or "").rstrip("/")


def go_url(target: str, dag_id: str, run_id: str) -> str:
    """The plugin route that redirects to ``target`` (mlflow-run, model-version, eval-report) of a run."""
    return f"{airflow_base()}{ROUTE}/go/{target}/{quote(dag_id, safe='')}/{quote(run_id, safe='')}"


class _RunFolderLink(BaseOperatorLink):
    """A link that exists once the run folder holds ``needs`` (a ``RunFolder`` path's name)."""

    target: ClassVar[str]
    needs: ClassVar[str]
    label: ClassVar[str]

    @property
    def name(self) -> str:
        return self.label

    @property
    def xcom_key(self) -> str:
        return f"taxiway_link_{self.target}"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        if not getattr(RunFolder(run_dir(ti_key.dag_id, ti_key.run_id)), self.needs).exists():
            return ""
        return go_url(self.target, ti_key.dag_id, ti_key.run_id)


class MlflowRunLink(_RunFolderLink):
    target, needs, label = "mlflow-run", "metrics", "MLflow run"


class ModelVersionLink(_RunFolderLink):
    target, needs, label = "model-version", "registry_record", "Model version"


class EvalReportLink(_RunFolderLink):
    target, needs, label = "eval-report", "eval_report", "Eval report"


TRAIN_LINKS = (MlflowRunLink(),)
EVALUATE_LINKS = (EvalReportLink(), MlflowRunLink())
REGISTER_LINKS = (ModelVersionLink(), MlflowRunLink(), EvalReportLink())


def with_links(xcom_arg: Any, links: tuple[BaseOperatorLink, ...]) -> Any:
    """Give the task behind a ``@task`` call's XComArg these links (a decorated task has none of its
    own; Airflow serializes the instance's ``operator_extra_links``)."""
    xcom_arg.operator.operator_extra_links = links
    return xcom_arg
