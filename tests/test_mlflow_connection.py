"""The ``mlflow_default`` connection → MLflow's tracking settings in the task process
(``taxiway_airflow.mlflow_connection``): a real Airflow connection, given as Airflow 3 reads one
from the environment (``AIRFLOW_CONN_MLFLOW_DEFAULT``, JSON), the step called as the task runner calls
it (the task SDK's listener manager, built from the plugins folder), and what MLflow's own client then
uses. No MLflow server is needed: the client's settings are read, not sent."""

from __future__ import annotations

import json
import logging
import secrets

import pytest

from taxiway_airflow import mlflow_connection

MLFLOW_ENV = ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The step writes os.environ itself; monkeypatch puts back what each test started with. A
    variable absent at the start is set first, so monkeypatch records it and removes what the step
    wrote (``delenv`` of an absent one records nothing: the step's value leaked into later tests)."""
    for name in (*MLFLOW_ENV, "AIRFLOW_CONN_MLFLOW_DEFAULT"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.setenv(mlflow_connection.CONNECTION_ENV, mlflow_connection.CONNECTION_ID)  # as deployed


def give_connection(monkeypatch: pytest.MonkeyPatch, **fields: object) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_DEFAULT", json.dumps({"conn_type": "http", **fields}))


def task_starts() -> None:
    """What the task runner does before a task runs (``task_runner._prepare``)."""
    from airflow.sdk.listener import get_listener_manager
    from airflow.utils.state import TaskInstanceState

    get_listener_manager().hook.on_task_instance_running(previous_state=TaskInstanceState.QUEUED, task_instance=None)


def client_settings() -> tuple[str, str | None, str | None]:
    """The tracking URI, user and password MLflow's client would send with its next request."""
    import mlflow
    from mlflow import MlflowClient

    creds = MlflowClient()._tracking_client.store.get_host_creds()
    return mlflow.get_tracking_uri(), creds.username, creds.password


def test_a_task_process_uses_the_connections_server_and_login(monkeypatch: pytest.MonkeyPatch,
                                                               caplog: pytest.LogCaptureFixture):
    from airflow.sdk._shared.secrets_masker import redact

    from pipelines.run_folder import mlflow_tracking_uri

    password = f"p%4@:{secrets.token_urlsafe(16)}"  # URL-special characters: MLflow sends it as basic auth
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://elsewhere:5000")  # the values file's; the connection wins
    give_connection(monkeypatch, host="mlflow.taxiway.svc.cluster.local", port=5000, schema="http",
                    login="taxiway", password=password)
    with caplog.at_level(logging.DEBUG):
        task_starts()
    uri = "http://mlflow.taxiway.svc.cluster.local:5000"
    assert client_settings() == (uri, "taxiway", password)
    assert mlflow_tracking_uri() == uri  # what Taxiway's registry client binds to
    assert password not in caplog.text and "MLFLOW_TRACKING_PASSWORD" in caplog.text
    assert password not in redact(f"a task log line holding {password}")  # Airflow masks it in task logs


def test_no_connection_leaves_the_environment_as_it_was(monkeypatch: pytest.MonkeyPatch):
    from pipelines.run_folder import mlflow_tracking_uri

    embedded = mlflow_tracking_uri()
    task_starts()
    assert mlflow_connection.apply() is False
    assert mlflow_tracking_uri() == embedded and embedded.startswith("sqlite:///")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow:5000")
    task_starts()
    assert client_settings() == ("http://mlflow:5000", None, None)
    give_connection(monkeypatch, host="http://elsewhere:5000")
    monkeypatch.delenv(mlflow_connection.CONNECTION_ENV)  # a deployment that did not opt in: never looked up
    assert mlflow_connection.apply() is False and client_settings() == ("http://mlflow:5000", None, None)


def test_a_connection_without_host_only_logs_in(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow:5000")
    give_connection(monkeypatch, login="taxiway", password="a-long-enough-password")
    assert mlflow_connection.apply() is True
    assert client_settings() == ("http://mlflow:5000", "taxiway", "a-long-enough-password")


@pytest.mark.parametrize(("fields", "uri"), [
    ({"host": "https://mlflow.example.com/tracking/"}, "https://mlflow.example.com/tracking"),
    ({"host": "mlflow", "port": 5000}, "http://mlflow:5000"),
    ({"host": "mlflow.example.com", "schema": "https"}, "https://mlflow.example.com"),
])
def test_the_host_is_a_url_or_a_name_with_schema_and_port(monkeypatch: pytest.MonkeyPatch, fields: dict, uri: str):
    give_connection(monkeypatch, **fields)
    assert mlflow_connection.apply() is True
    assert client_settings() == (uri, None, None)


def _refusal(status: int):
    """The error MLflow's client raises for a response of ``status`` (its own verify_rest_response)."""
    import requests
    from mlflow.utils.rest_utils import verify_rest_response

    response = requests.models.Response()
    response.status_code, response._content = status, b"You are not authenticated. Please see docs for login."
    try:
        verify_rest_response(response, "/api/2.0/mlflow/runs/log-batch")
    except Exception as exc:  # noqa: BLE001 - whatever MLflow raises is what the trigger sees
        return exc
    raise AssertionError(f"MLflow accepted a {status}")


def test_the_triggerer_ships_metrics_logged_in_and_says_why_it_could_not(monkeypatch: pytest.MonkeyPatch,
                                                                         caplog: pytest.LogCaptureFixture):
    """The triggerer runs no task listener: a trigger's report applies the connection itself. A report
    MLflow refuses (401) is an error naming the fix; one that may pass (the server away) a warning."""
    import asyncio

    from airflow.sdk.exceptions import AirflowSecretsBackendAccessDenied

    from taxiway_airflow.triggers.gang import log_progress

    password = secrets.token_urlsafe(16)
    give_connection(monkeypatch, host="http://mlflow:5000", login="taxiway", password=password)
    log = logging.getLogger("test.trigger")
    seen = []
    with caplog.at_level(logging.INFO, logger="test.trigger"):
        asyncio.run(log_progress(log, lambda: seen.append(client_settings()) or "step 7"))
        for exc in (_refusal(401), _refusal(403), AirflowSecretsBackendAccessDenied("mlflow_default"),
                    ConnectionError("Connection refused")):
            asyncio.run(log_progress(log, lambda exc=exc: (_ for _ in ()).throw(exc)))
    assert seen == [("http://mlflow:5000", "taxiway", password)]
    assert [(r.levelname, r.getMessage().split(" (")[0]) for r in caplog.records] == [
        ("INFO", "step 7"), *[("ERROR", "MLflow refused the live metrics")] * 3, ("WARNING", "could not ship the live metrics to MLflow yet")]
    assert "TAXIWAY_MLFLOW_LOGIN_CONN_ID" in caplog.records[1].getMessage() and password not in caplog.text


def test_a_login_the_connection_no_longer_gives_is_dropped(monkeypatch: pytest.MonkeyPatch):
    """The triggerer applies the connection for as long as it lives: a password removed from the
    connection must not stay in its environment from an earlier report."""
    give_connection(monkeypatch, host="http://mlflow:5000", login="taxiway", password="old-password-1234")
    mlflow_connection.apply(quiet=True)
    give_connection(monkeypatch, host="http://mlflow:5000")
    mlflow_connection.apply(quiet=True)
    assert client_settings() == ("http://mlflow:5000", None, None)
