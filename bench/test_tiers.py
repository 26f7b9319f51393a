"""The test tiers' cost (issue 32): wall and CPU of ``make test``'s and ``make test-live``'s pytest,
per module and per test, with the order's seed, into ``bench/results/test_tiers_<commit>.json``.

CPU is this process's reaped children (the pytest tree: workers, their subprocesses and the gangs
they waited for); the live tier's shared deployment is detached and not counted.

    .venv/bin/python bench/test_tiers.py [--tier test|test-live] [--seed N] [--out FILE] [-- PYTEST ARGS]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import random
import resource
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MARKS = {"test": "not live and not browser", "test-live": "live or browser"}
WORKERS = {"test": "3", "test-live": "2"}  # as the Makefile runs them


def run_tier(tier: str, seed: int, extra: list[str]) -> dict:
    log = Path(tempfile.mkdtemp(prefix="tiers-")) / "tests.jsonl"
    env = {**os.environ, "TAXIWAY_CPU_LOG": str(log),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "bench"), os.environ.get("PYTHONPATH")]))}
    cmd = [str(REPO / ".venv" / "bin" / "pytest"), "-p", "cpu_per_test", "-n", WORKERS[tier], "-m", MARKS[tier],
           f"--randomly-seed={seed}", "-q", "-p", "no:cacheprovider", *extra]
    before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    wall, after = time.monotonic() - started, resource.getrusage(resource.RUSAGE_CHILDREN)
    tests = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    modules: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for t in tests:
        modules[t["test"].split("::")[0]][0] += t["wall_s"]
        modules[t["test"].split("::")[0]][1] += t["cpu_s"]
    return {"command": " ".join(cmd[1:]), "exit": proc.returncode, "summary": proc.stdout.strip().splitlines()[-1:],
            "failed": [line for line in proc.stdout.splitlines() if line.startswith(("FAILED ", "ERROR "))],
            "wall_s": round(wall, 1),
            "cpu_s": round(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, 1),
            "slowest": sorted(tests, key=lambda t: -t["wall_s"])[:15],
            "modules": {m: {"wall_s": round(w, 1), "cpu_s": round(c, 1)}
                        for m, (w, c) in sorted(modules.items(), key=lambda kv: -kv[1][1])},
            "tests": tests}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tier", choices=sorted(MARKS), action="append")
    ap.add_argument("--seed", type=int, default=random.randrange(2**31))
    ap.add_argument("--out", type=Path, help="default: bench/results/test_tiers_<commit>.json")
    ap.add_argument("pytest_args", nargs="*", help="after --: passed to pytest (a subset, to try this script)")
    args = ap.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    figures = {tier: run_tier(tier, args.seed, args.pytest_args) for tier in args.tier or ["test", "test-live"]}
    out = args.out or REPO / "bench" / "results" / f"test_tiers_{commit}.json"
    out.write_text(json.dumps({"date": datetime.now(UTC).isoformat(timespec="seconds"), "commit": commit,
                               "machine": f"{platform.node()}: {os.cpu_count()} cores", "seed": args.seed,
                               "command": " ".join(sys.argv), "figures": figures}, indent=1) + "\n")
    for tier, f in figures.items():
        print(f"{tier}: {f['wall_s']:.0f} s wall, {f['cpu_s'] / 60:.1f} CPU-min, exit {f['exit']}, {f['summary']}")
        print(*f["failed"], sep="\n")
    print(out)
    return max(f["exit"] for f in figures.values())


if __name__ == "__main__":
    sys.exit(main())
