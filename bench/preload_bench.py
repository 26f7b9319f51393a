"""What ``taxiway_airflow.preload.task_imports`` saves each task process: the CPU a forked task spends
importing what Taxiway's tasks import (the DAG file, and the preflight gate's Great Expectations), with
and without the preload in the process it is forked from.

Each side runs in a fresh interpreter shaped like a LocalExecutor worker (Airflow's task runner
imported), which forks ``--tasks`` children one after another; each child parses ``dags/taxiway_train.py``
as a task process does, then imports the gate's modules, and reports its CPU for each. The baseline is
Airflow's own LocalExecutor worker (no preload). One core: the children run one at a time.

    .venv/bin/python bench/preload_bench.py --tasks 7 --out bench/results/preload.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

WORKER = """
import json, os, runpy, sys, time
import airflow.sdk.execution_time.task_runner  # what a LocalExecutor worker holds before it forks
if sys.argv[1] == "preloaded":
    from taxiway_airflow.preload import task_imports
    assert task_imports()
costs = []
for _ in range(int(sys.argv[2])):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        t = time.process_time()
        runpy.run_path("dags/taxiway_train.py")
        parse = time.process_time() - t
        from pipelines.stages import preflight
        preflight.preload()
        os.write(write, json.dumps([parse, time.process_time() - t - parse]).encode())
        os._exit(0)
    os.close(write)
    costs.append(json.loads(os.read(read, 4096)))
    os.waitpid(pid, 0)
print("COSTS", json.dumps(costs))
"""


def run(mode: str, tasks: int) -> list[list[float]]:
    out = subprocess.run([sys.executable, "-c", WORKER, mode, str(tasks)], cwd=REPO, capture_output=True,
                         text=True, timeout=600)
    if out.returncode:
        raise SystemExit(f"{mode} worker failed:\n{out.stderr[-3000:]}")
    (line,) = (ln for ln in out.stdout.splitlines() if ln.startswith("COSTS "))
    return json.loads(line.removeprefix("COSTS "))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--tasks", type=int, default=7, help="forked tasks per side (1 to 50)")
    parser.add_argument("--out", type=Path, help="write the figures here as JSON as well")
    args = parser.parse_args()
    if not 1 <= args.tasks <= 50:
        parser.error(f"--tasks {args.tasks}: give 1 to 50")
    if args.out and not args.out.parent.is_dir():
        parser.error(f"--out {args.out}: its folder does not exist")
    figures = {}
    for mode in ("airflow", "preloaded"):
        costs = run(mode, args.tasks)
        figures[mode] = {"dag_parse_cpu_s": round(statistics.median(c[0] for c in costs), 3),
                         "gate_imports_cpu_s": round(statistics.median(c[1] for c in costs), 3),
                         "raw": [[round(x, 3) for x in c] for c in costs]}
        print(f"{mode:10s} per task, median of {args.tasks}: DAG file parse {figures[mode]['dag_parse_cpu_s']:.3f} "
              f"CPU-s, the gate's imports {figures[mode]['gate_imports_cpu_s']:.3f} CPU-s")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip()
    result = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "machine": f"{os.cpu_count()} cores",
              "command": " ".join(["python", *sys.argv]), "commit": commit,
              "notes": "forked task processes run one at a time (1 core); baseline: Airflow's LocalExecutor worker",
              "figures": figures}
    if args.out:
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=1) + "\n")
        tmp.replace(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
