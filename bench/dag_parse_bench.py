"""DAG parse time: how long the DAG processor spends on each file of the dags/ folder.

For each file of dags/, runs N fresh interpreters that each build a DagBag of that one file and
serialize its DAG (what the DAG processor does per file, and what the api-server and ``dag.test``
do again) and reports the medians of the parse time measured inside Airflow (DagBag's own timer),
of the serialization (``DagSerialization.to_dict``, which resolves every param of every task) and
of the whole interpreter's wall time, next to an empty DAG file as the floor.

    .venv/bin/python bench/dag_parse_bench.py [--runs 7]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_PROBE = """
import json, sys, time
sys.path.insert(0, {plugins!r})
from airflow.dag_processing.dagbag import DagBag
from airflow.serialization.serialized_objects import DagSerialization
t = time.perf_counter()
bag = DagBag(dag_folder={folder!r})
elapsed = time.perf_counter() - t
t = time.perf_counter()
for dag in bag.dags.values():
    DagSerialization.to_dict(dag)
serialized = time.perf_counter() - t
print(json.dumps({{"parse_s": elapsed, "serialize_s": serialized, "errors": len(bag.import_errors),
                   "dags": len(bag.dags)}}))
"""

_EMPTY_DAG = """
import pendulum
from airflow.sdk import DAG
from airflow.providers.standard.operators.empty import EmptyOperator
with DAG("empty", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")):
    EmptyOperator(task_id="noop")
"""


def measure(dag_file: Path, runs: int) -> dict:
    parse, serialize, wall = [], [], []
    for _ in range(runs):
        code = _PROBE.format(plugins=str(REPO / "plugins"), folder=str(dag_file))
        t = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ)
        wall.append(time.perf_counter() - t)
        result = json.loads(out.stdout.strip().splitlines()[-1])
        assert result["errors"] == 0 and result["dags"] == 1, result
        parse.append(result["parse_s"])
        serialize.append(result["serialize_s"])
    return {"parse_median_s": statistics.median(parse), "serialize_median_s": statistics.median(serialize),
            "wall_median_s": statistics.median(wall)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "empty_dag.py").write_text(_EMPTY_DAG)
        floor = measure(Path(tmp) / "empty_dag.py", args.runs)
    ours = {path.stem: measure(path, args.runs) for path in sorted((REPO / "dags").glob("*.py"))}
    ratios = {name: round(m["parse_median_s"] / floor["parse_median_s"], 2) for name, m in ours.items()}
    print(json.dumps({"runs": args.runs, **ours, "empty_dag": floor, "parse_ratio_vs_empty": ratios}, indent=2))


if __name__ == "__main__":
    main()
