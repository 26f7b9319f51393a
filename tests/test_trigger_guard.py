"""The api-server's trigger guard: a Taxiway trigger whose conf holds a number no task could receive
is refused before a run exists (400, naming the key path, never the value); every other request
reaches Airflow with its body as sent. Against a live api-server: ``test_live_conf.py``."""

from __future__ import annotations

import json

import httpx
import pytest

from taxiway_airflow.trigger_guard import TriggerConfGuard


async def _airflow(scope, receive, send) -> None:
    """Stands in for Airflow's app: answers with the body it received."""
    body, more = b"", True
    while more:
        message = await receive()
        body, more = body + message.get("body", b""), message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": json.dumps({"received": body.decode()}).encode()})


def _post(path: str, doc: dict) -> httpx.Response:
    transport = httpx.ASGITransport(app=TriggerConfGuard(_airflow))

    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            return await client.post(path, content=json.dumps(doc))

    import asyncio

    return asyncio.run(go())


def test_a_number_no_task_could_receive_is_refused_naming_its_key_not_its_value():
    huge = 2**64 + 12345
    resp = _post("/api/v2/dags/taxiway_train/dagRuns",
                 {"logical_date": None, "conf": {"trian": huge, "compute": {"kubernetes": {"affinity": {"w": [1, -huge]}}}}})
    assert resp.status_code == 400, resp.text
    detail = resp.json()["detail"]
    assert "trian: a number outside the signed 64-bit range" in detail
    assert "compute.kubernetes.affinity.w[1]" in detail and str(huge) not in resp.text


def test_a_refusal_names_at_most_twenty_keys():
    resp = _post("/api/v2/dags/taxiway_train/dagRuns", {"conf": {f"k{i}": 2**64 for i in range(500)}})
    detail = resp.json()["detail"]
    assert resp.status_code == 400 and detail.count("k") == 20 and detail.endswith("; and 480 more"), detail


def test_a_body_too_large_to_be_a_conf_is_refused_unread():
    resp = _post("/api/v2/dags/taxiway_train/dagRuns", {"conf": {"set": ["x" * 4096] * 300}})
    assert resp.status_code == 413 and "at most 64 KiB" in resp.json()["detail"]


def test_a_backfill_of_a_taxiway_dag_is_held_to_the_same_rule():
    doc = {"dag_id": "taxiway_train", "from_date": "2026-12-01T00:00:00Z", "to_date": "2026-12-02T00:00:00Z",
           "dag_run_conf": {"train": {"seed": 2**64}}}
    for path in ("/api/v2/backfills", "/api/v2/backfills/dry_run"):
        resp = _post(path, doc)
        assert resp.status_code == 400 and "train.seed: a number outside" in resp.json()["detail"], (path, resp.text)


@pytest.mark.parametrize("path, doc", [
    ("/api/v2/backfills", {"dag_id": "someone_elses", "dag_run_conf": {"n": 2**64}}),
    ("/api/v2/dags/taxiway_train/dagRuns", {"conf": {"train": {"lr": 0.0003, "seed": 2**31}}}),
    ("/api/v2/dags/someone_elses/dagRuns", {"conf": {"n": 2**64}}),  # not Taxiway's to judge
    ("/api/v2/dags/taxiway_train/dagRuns", {"conf": "not an object"}),  # Airflow's to refuse
])
def test_every_other_trigger_reaches_airflow_with_its_body_as_sent(path: str, doc: dict):
    resp = _post(path, doc)
    assert resp.status_code == 200 and json.loads(resp.json()["received"]) == doc


def test_an_asset_materialization_and_a_sub_path_base_url_are_held_to_the_same_rule():
    """``POST /api/v2/assets/{id}/materialize`` creates a run of the asset's producer (taxiway_land for
    the landing zone) with a conf; and an api-server on a sub-path (``[api] base_url``) prefixes every
    route. Both once went around the guard."""
    for path, doc in (("/api/v2/assets/7/materialize", {"conf": {"source": "/data/x", "n": 2**64}}),
                      ("/airflow/api/v2/dags/taxiway_train/dagRuns", {"conf": {"n": 2**64}}),
                      ("/team/a/api/v2/backfills", {"dag_id": "taxiway_train", "dag_run_conf": {"n": 2**64}})):
        resp = _post(path, doc)
        assert resp.status_code == 400 and "n: a number outside" in resp.json()["detail"], (path, resp.text)


def test_what_the_first_task_would_refuse_is_refused_before_a_run_exists():
    """One intake, in one order, at the door: unknown keys, fields only the deployment sets (the gate's
    set, the cluster), a config file the deployment does not list, and limits, each named (400, no run)."""
    for path, conf, named in (
            ("/api/v2/dags/taxiway_train/dagRuns", {"trian": {"lr": 0.1}}, "trian: not a conf key (did you mean 'train'?)"),
            ("/api/v2/dags/taxiway_refresh/dagRuns", {"data": {"val": "/data/train"}}, "data.val: only the deployment sets this"),
            ("/api/v2/dags/taxiway_sweep/dagRuns", {"sweep": [{}], "compute": {"kubernetes": {"image": "x/y:1"}}},
             "compute.kubernetes.image: only the deployment sets this"),
            ("/api/v2/dags/taxiway_train/dagRuns", {"config": "base.yaml"}, "config 'base.yaml': not a config this deployment lets a trigger choose"),
            ("/api/v2/dags/taxiway_train/dagRuns", {"compute": {"nodes": 17}}, "compute.nodes (17) exceeds limits.nodes (16)"),
            ("/api/v2/dags/taxiway_land/dagRuns", {"source": "/data/x", "train": {}}, "train: not a conf key"),
            # a sweep's points pass the same intake: an owned leaf, a bound, a point count
            ("/api/v2/dags/taxiway_sweep/dagRuns", {"sweep": {"compute.kubernetes.image": ["a/b:1", "c/d:2"]}},
             "sweep[0].compute.kubernetes.image: only the deployment sets this"),
            ("/api/v2/dags/taxiway_sweep/dagRuns", {"sweep": [{"train.lr": 0.001}, {"train.lr": -1}]},
             "sweep[1].train.lr"),
            ("/api/v2/dags/taxiway_sweep/dagRuns", {"sweep": {"train.seed": list(range(17))}},
             "sweep: 17 member(s); a sweep has 2 to"),
            ("/api/v2/dags/taxiway_sweep/dagRuns", {"train": {"seed": 1}}, "sweep: missing")):
        resp = _post(path, {"conf": conf})
        assert resp.status_code == 400 and named in resp.json()["detail"], (path, resp.text)
    backfill = {"dag_id": "taxiway_train", "from_date": "2026-12-01T00:00:00Z", "to_date": "2026-12-02T00:00:00Z",
                "dag_run_conf": {"eval": {"confidence": 0.5}}}
    resp = _post("/api/v2/backfills", backfill)
    assert resp.status_code == 400 and "eval.confidence: only the deployment sets this" in resp.json()["detail"]
    assert _post("/api/v2/dags/taxiway_train/dagRuns", {"conf": {"train": {"seed": 7}}}).status_code == 200
    assert _post("/api/v2/dags/taxiway_sweep/dagRuns", {"conf": {"sweep": {"train.seed": [1, 2]}}}).status_code == 200
