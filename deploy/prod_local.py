"""`make prod-local`: the production shape on this machine, by hand (what it starts, and how to use
it: docs/deploy.md, "Start the same shape by hand"). Runs until Ctrl-C, then stops everything. Its
servers are ``deploy/local/``'s, which the live tests start too."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "deploy" / "local"), str(REPO)]

from live_airflow import CeleryShape, LiveAirflow  # noqa: E402
from mlflow_server import mlflow_server  # noqa: E402
from postgres import fresh_db, pg_uri  # noqa: E402
from redis_server import redis_url  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=REPO / ".taxiway" / "prod-local",
                    help="AIRFLOW_HOME, TAXIWAY_HOME, logs and MLflow artifacts go here")
    ap.add_argument("--config", type=Path, default=REPO / "configs" / "tiny.yaml")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    from pipelines.demo_data import write_demo_data

    broker = redis_url()
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):  # Ctrl-C ends the wait below, never inside a lock
        signal.signal(sig, lambda *_: done.set())
    with fresh_db("taxiway_airflow") as metadata, mlflow_server(args.root / "mlflow") as tracking:
        live = LiveAirflow(args.root / "deployment",
                           extra_env={"TAXIWAY_CONFIG": str(args.config), "MLFLOW_TRACKING_URI": tracking.uri},
                           celery=CeleryShape(pg_uri(metadata), broker, args.workers))
        if not (live.taxiway_home / "demo-data" / "manifest.jsonl").exists():
            write_demo_data(live.taxiway_home / "demo-data", seed=0, max_files=160)
        live.start()
        try:
            print(f"Airflow UI/API : {live.url}  (user admin, password {live.password})\n"
                  f"MLflow         : {tracking.uri}\n"
                  f"metadata       : {pg_uri(metadata)} (dropped on exit)\n"
                  f"broker         : {broker}\n"
                  f"logs           : {live.root}/*.log\n"
                  f"TAXIWAY_HOME   : {live.taxiway_home}\n"
                  "Ctrl-C stops everything.", flush=True)
            while not done.wait(1.0):
                pass
        finally:
            live.stop()  # the PostgreSQL database goes with fresh_db; Redis and S3 servers are this process's own


if __name__ == "__main__":
    main()
