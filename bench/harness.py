"""What the data-stage benchmarks (``preflight_bench.py``, ``tokenize_bench.py``) share: one fresh
process per measurement, pinned to one core or left on all of them, medians, peak RSS, and the
record — raw JSON and a markdown table — written atomically under ``bench/results/``.

Pinning (``sched_setaffinity`` before anything heavy is imported) is how "one process" stays one
core for every method alike: Rust thread pools (tiktoken, HF tokenizers' Rayon, rensa's batch
APIs) and the tokenize stage size themselves by the process's affinity.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ALL, ONE = "all", "1"


def pin(cores: str) -> None:
    """Run this process (and the threads it starts later) on one core, or leave it on all."""
    if cores == ONE:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


def peak_mib() -> float:
    """This process's peak RSS (VmHWM: unlike ru_maxrss it does not carry the parent's peak over
    fork + exec); its threads included, child processes not."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def measure(script: str, args: Sequence[str], cores: str) -> dict:
    """Run ``script --child ARGS --cores CORES`` in a fresh interpreter; its last stdout line (JSON)."""
    # no method uses BLAS; OpenBLAS threads spin after import and would take a core from short runs
    env = {**os.environ, "PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, script, "--child", *args, "--cores", cores],
                          capture_output=True, text=True, env=env)
    if proc.returncode:
        sys.exit(f"{Path(script).name} {' '.join(args)} (cores {cores}) failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def summary(runs: list[dict], key: str = "seconds") -> dict:
    """Median and every repeat of ``key``, and the largest peak RSS."""
    values = [r[key] for r in runs]
    return {"median_s": round(statistics.median(values), 3), "runs_s": [round(v, 3) for v in values],
            "peak_rss_mib": round(max(r.get("peak_rss_mib", 0.0) for r in runs), 1)}


def conditions() -> dict:
    """What was running: load averages and cores (the machine is shared; a table carries this)."""
    return {"loadavg": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count(),
            "cores_usable": len(os.sched_getaffinity(0))}


def write(name: str, command: str, notes: str, figures: dict, table: str, out_dir: Path, started: dict) -> Path:
    """``out_dir/NAME.json`` (the record: date, machine, command, commit, notes, figures) and
    ``out_dir/NAME.md`` (the table), each written to a temp file and renamed into place."""
    sys.path.insert(0, str(REPO))
    from trainer import fsio

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True,
                           cwd=REPO).stdout.strip()
    record = {"date": started["date"],
              "machine": {"node": platform.node(), "python": platform.python_version(), "cpus": os.cpu_count(),
                          "conditions": {"start": started["conditions"], "end": conditions()}},
              "command": command, "commit": commit + ("+uncommitted" if dirty else ""), "notes": notes,
              "figures": figures}
    fsio.write_json(out_dir / f"{name}.json", record)
    fsio.write_text(out_dir / f"{name}.md", table)
    return out_dir / f"{name}.json"


def start() -> dict:
    return {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "conditions": conditions(),
            "t0": time.perf_counter()}


def markdown(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]) + "\n"


def arguments(child: tuple[str, ...], slow: str) -> argparse.Namespace:
    """The options both benchmarks take; ``--child`` (internal) runs one measurement."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--slow-repeats", type=int, default=1, help=f"repeats of {slow}")
    ap.add_argument("--corpora", default="x1,x10")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    ap.add_argument("--child", nargs=len(child), metavar=child, help=argparse.SUPPRESS)
    ap.add_argument("--cores", default=ALL, help=argparse.SUPPRESS)
    return ap.parse_args()


def finish(script: str, args: argparse.Namespace, notes: str, figures: dict, table: str, started: dict) -> None:
    """Write the record and the table (``write``), print the table and where they went."""
    name = Path(script).stem.removesuffix("_bench")
    command = (f".venv/bin/python bench/{Path(script).name} --repeats {args.repeats} --slow-repeats {args.slow_repeats} "
               f"--corpora {args.corpora}")
    path = write(name, command, notes, figures, table, args.out, started)
    print(table)
    print(f"wrote {path} and {path.with_suffix('.md')} in {time.perf_counter() - started['t0']:.0f} s")
