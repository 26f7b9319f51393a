"""Where a command's CPU goes, by kind of process: runs CMD, samples every process on the machine twice a
second (``/proc/<pid>/stat``), and prints CPU-seconds per kind, busiest first.

Why: ``time`` counts only the CPU of the processes it waits for, so the daemons a test tier starts
(PostgreSQL, Airflow's services, a forked task) are missing from it, and a tier can look idle while
the machine is saturated. A process that lives under half a second is missed; one that ends between two
samples loses at most its last half second. A process is filed under the kind its latest command line
says (pytest-xdist's workers retitle themselves), and an exited one (a zombie: no command line left)
under the kind it had while alive.

    .venv/bin/python bench/cpu_by_process.py --out bench/results/cpu_live_tier.json -- make test-live
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
KINDS = (  # first match wins: (kind, pattern on the command line)
    ("airflow task (supervisor and runner)", r"airflow (task|supervisor)|task_runner|execute_workload"),
    ("airflow scheduler", r"airflow scheduler"),
    ("airflow triggerer", r"airflow triggerer"),
    ("airflow dag-processor", r"airflow dag-processor|dag_processor"),
    ("airflow api-server", r"airflow api[-_]server|uvicorn|gunicorn"),
    ("airflow worker (LocalExecutor, Celery)", r"LocalExecutor|celery|airflow worker"),
    ("training node (torchrun, trainer)", r"torchrun|trainer|torch\.distributed"),
    ("mlflow server", r"mlflow"),
    ("postgres", r"^postgres|postgres:"),
    ("redis", r"redis-server"),
    ("chromium", r"chrom"),
    ("S3 (moto)", r"moto"),
    ("pytest", r"pytest|xdist"),
)


def kind_of(cmdline: str) -> str:
    for kind, pattern in KINDS:
        if re.search(pattern, cmdline):
            return kind
    return "other: " + re.sub(r"\d+", "N", cmdline[:60])


def sample() -> dict[int, tuple[int, str | None, str]]:
    """pid → (CPU ticks so far, kind by its command line or None when it has none, kind by its name)."""
    seen = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            cmdline = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        seen[int(entry.name)] = (int(fields[11]) + int(fields[12]), kind_of(cmdline) if cmdline else None,
                                 kind_of(comm))
    return seen


def machine_busy_s() -> float:
    """CPU-seconds the whole machine spent not idle since boot."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / TICK


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--out", type=Path, help="write the figures here as JSON as well")
    parser.add_argument("--every-s", type=float, default=0.5)
    parser.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error("no command given (after --)")
    if not 0.05 <= args.every_s <= 60:
        parser.error(f"--every-s {args.every_s}: give 0.05 to 60 seconds")
    if args.out and not args.out.parent.is_dir():
        parser.error(f"--out {args.out}: its folder does not exist")  # before the run, not after it
    baseline = sample()
    first = {pid: ticks for pid, (ticks, _, _) in baseline.items()}
    last: dict[int, tuple[int, str]] = {}
    busy0, t0 = machine_busy_s(), time.monotonic()
    child = subprocess.Popen(cmd)
    while child.poll() is None:
        time.sleep(args.every_s)
        for pid, (ticks, kind, by_name) in sample().items():
            last[pid] = (ticks, kind or (last[pid][1] if pid in last else by_name))
    wall, busy = time.monotonic() - t0, machine_busy_s() - busy0
    per_kind: dict[str, float] = defaultdict(float)
    for pid, (ticks, kind) in last.items():
        per_kind[kind] += (ticks - first.get(pid, 0)) / TICK
    rows = sorted(((round(s, 1), k) for k, s in per_kind.items() if s >= 0.5), reverse=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    result = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "machine": f"{os.cpu_count()} cores",
              "command": " ".join(cmd), "commit": commit, "rc": child.returncode, "wall_s": round(wall, 1),
              "machine_busy_cpu_s": round(busy, 1), "cpu_s_by_kind": {k: s for s, k in rows}}
    print(f"\n{wall:.0f} s wall; the machine was busy {busy:.0f} CPU-s ({busy / wall:.2f} of {os.cpu_count()} cores)")
    for s, k in rows:
        print(f"{s:9.1f} CPU-s  {k}")
    if args.out:
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=1) + "\n")
        tmp.replace(args.out)
    return child.returncode


if __name__ == "__main__":
    sys.exit(main())
