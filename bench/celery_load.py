"""Load on the production shape: N concurrent ``taxiway_train`` runs (tiny config, each its own seed
and step count) on Airflow with the CeleryExecutor (PostgreSQL metadata, Redis broker, two Celery
workers, a triggerer) and an MLflow tracking server on PostgreSQL — the shape of
tests/test_live_celery.py, started by this script with the same harness.

Reported: wall time from the first trigger to the last run's end, failed runs and task instances
that needed a second try (the target is 0 for both: the machine is loaded past its cores),
the scheduler's task latency (a task's ``queued_when`` → ``start_date``, and its upstream's end →
its own ``start_date``) as percentiles; then the checks: every run's packed dataset is the same
content-addressed folder, built once (one tokenize miss, N-1 hits) and intact (every file's sha256
as its manifest records); the registry holds one version per run; the champion is a version that
no other version beat by the gate's rules.

    .venv/bin/python bench/celery_load.py [--runs 10]   # raw results: bench/results/celery_load.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "deploy" / "local"), str(REPO / "tests"), str(REPO)]

from live_airflow import CeleryShape, LiveAirflow  # noqa: E402
from mlflow_server import mlflow_server  # noqa: E402
from postgres import fresh_db, pg_uri  # noqa: E402
from redis_server import redis_url  # noqa: E402

DAG = "taxiway_train"
TINY = REPO / "configs" / "tiny.yaml"


def _ts(value: str | None) -> float | None:
    return datetime.fromisoformat(value).timestamp() if value else None


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    q = statistics.quantiles(values, n=100, method="inclusive") if len(values) > 1 else [values[0]] * 99
    return {"p50": round(q[49], 2), "p90": round(q[89], 2), "p99": round(q[98], 2), "max": round(max(values), 2),
            "n": len(values)}


def _latencies(live: LiveAirflow, run_ids: list[str]) -> dict[str, dict[str, float]]:
    """queued → started, and upstream done → started, over every task instance that ran."""
    dag = live.api.get(f"/api/v2/dags/{DAG}/tasks").json()["tasks"]
    upstream = {t["task_id"]: [u for u in dag if t["task_id"] in u.get("downstream_task_ids", [])] for t in dag}
    queued, ready = [], []
    for run_id in run_ids:
        tis = live.task_instances(DAG, run_id)
        for task_id, ti in tis.items():
            start = _ts(ti.get("start_date"))
            if start is None:
                continue
            if ti.get("queued_when"):
                queued.append(start - _ts(ti["queued_when"]))
            ends = [_ts(tis[u["task_id"]].get("end_date")) for u in upstream.get(task_id, []) if u["task_id"] in tis]
            if ends and all(ends):
                ready.append(start - max(ends))
    return {"queued_to_start_s": _percentiles(queued), "upstream_done_to_start_s": _percentiles(ready)}


def _retried(live: LiveAirflow, run_ids: list[str]) -> list[str]:
    """``run/task`` of every task instance that needed more than one try: under this load, none may
    (a stall, startup or sensor timeout misfiring; what tests/test_live_conf.py's burner test checked)."""
    return [f"{run_id}/{task_id}" for run_id in run_ids for task_id, ti in live.task_instances(DAG, run_id).items()
            if ti["try_number"] > 1]


def _packed_checks(home: Path, run_ids: list[str]) -> dict:
    """Every run's packed dataset, its files against the manifest's sha256s, and the tokenize hits."""
    from pipelines.run_folder import run_dir as run_folder_of
    from trainer import fsio

    folders, hits, intact = set(), [], True
    for run_id in run_ids:
        run_dir = run_folder_of(DAG, run_id, home)
        pointer = json.loads((run_dir / "tokenize" / "packed.json").read_text())
        folders.add(pointer["path"])
        hits.append(bool(pointer.get("cache_hit")))
    for folder in folders:
        manifest = json.loads((Path(folder) / "manifest.json").read_text())
        shards = [sh for split in manifest["splits"].values() for sh in split["shards"]]
        intact &= bool(shards) and all(fsio.sha256_file(Path(folder) / sh["path"]) == sh["sha256"] for sh in shards)
    return {"packed_folders": len(folders), "cache_hits": sum(hits), "intact": intact}


def _registry_checks(uri: str, runs: int) -> dict:
    os.environ["MLFLOW_TRACKING_URI"] = uri
    from pipelines.registry import client

    c = client()
    versions = c.search_model_versions("name = 'taxiway-tiny-gpt'")
    champion = c.get_model_version_by_alias("taxiway-tiny-gpt", "champion")
    bpb = {v.version: float(v.tags.get("taxiway.eval.bits_per_byte", "nan")) for v in versions}
    beaten = [v.version for v in versions if v.tags.get("taxiway.eval.passed") == "true"
              and v.tags.get("taxiway.baseline", "").endswith(f"/{champion.version}")]
    return {"versions": len(versions), "runs": runs, "champion": champion.version,
            "champion_bpb": bpb[champion.version], "best_bpb": min(bpb.values()),
            "passed_against_champion": beaten, "bpb": bpb}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "celery_load.json")
    args = ap.parse_args()
    from pipelines.demo_data import write_demo_data

    root = Path(tempfile.mkdtemp(prefix="celery-load-"))
    with fresh_db("taxiway_airflow") as metadata, mlflow_server(root / "mlflow") as tracking:
        live = LiveAirflow(root / "deployment", extra_env={"TAXIWAY_CONFIG": str(TINY),
                                                         "MLFLOW_TRACKING_URI": tracking.uri},
                           celery=CeleryShape(pg_uri(metadata), redis_url()))
        write_demo_data(live.taxiway_home / "demo-data", seed=0, max_files=160)
        live.start()
        try:
            live.wait_dag(DAG)
            live.unpause(DAG)
            t0 = time.time()
            run_ids = []
            for i in range(args.runs):
                resp = live.trigger(DAG, {"train": {"seed": i, "steps": 30 + 5 * i}})
                resp.raise_for_status()
                run_ids.append(resp.json()["dag_run_id"])
            ends = [live.wait_run(DAG, r, timeout_s=3000) for r in run_ids]
            wall = max(_ts(e["end_date"]) for e in ends) - t0
            failed = [e["dag_run_id"] for e in ends if e["state"] != "success"]
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                    text=True).stdout.strip()
            result = {
                "date": datetime.now(UTC).isoformat(timespec="seconds"),
                "machine": f"{platform.node()} ({os.cpu_count()} cores)", "commit": commit,
                "command": f".venv/bin/python bench/celery_load.py --runs {args.runs}",
                "notes": "CeleryExecutor, 2 workers x 4 slots, PostgreSQL metadata, Redis broker, MLflow server; "
                         "tiny config, run i: seed i, 30 + 5 i steps; triggered back to back over REST",
                "figures": {"runs": args.runs, "wall_s": round(wall, 1), "failed": failed,
                            "retried": _retried(live, run_ids),
                            "latency": _latencies(live, run_ids), "packed": _packed_checks(live.taxiway_home, run_ids),
                            "registry": _registry_checks(tracking.uri, args.runs)}}
        finally:
            live.stop()
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
