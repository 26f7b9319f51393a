"""Both data stages at 10x and 100x: does the cost grow at most linearly, and memory stay flat?

Corpora from ``bench/corpus.py`` (variants of the demo corpus, vocabulary and duplicates growing with
the scale; 100x is about 1 GB). Each stage runs as the CLI a user would run, ``taxiway preflight`` then
``taxiway tokenize`` with ``--workers`` processes (the same plan → mapped shards → reduce as the Airflow
tasks), in a fresh process with a cold cache (a new ``TAXIWAY_HOME`` per repeat). Measured: wall time,
and the peak RSS of the largest single process of the stage (``wait4``'s ``ru_maxrss``: the stage's
process and every process it waited for, each a shard "task" or the reduce). Targets (issue 18 item 3):
wall(100x) / wall(10x) <= 11 per stage, peak RSS(100x) <= 1.3 x peak RSS(10x).

    .venv/bin/python bench/scale_bench.py [--scales 10,100] [--workers 2] [--repeats 1] [--data DIR]

writes ``bench/results/scale.json`` (raw) and ``scale.md`` (table).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus  # noqa: E402
import harness  # noqa: E402

REPO = harness.REPO
TAXIWAY = Path(sys.executable).with_name("taxiway")
STAGES = ("preflight", "tokenize")
WALL_RATIO, RSS_RATIO = 11.0, 1.3


def run_stage(stage: str, data: Path, home: Path, run_dir: Path, workers: int) -> dict:
    """One stage in a fresh process: wall seconds, the largest process's peak RSS, its last lines."""
    sets = [f"data.{k}={v}" for k, v in (("train", data / "train"), ("val", data / "val"),
                                          ("manifest", data / "manifest.jsonl"))]
    cmd = [str(TAXIWAY), stage, "-c", str(REPO / "configs" / "demo.yaml"), "--run-dir", str(run_dir),
           "--workers", str(workers), *[a for s in sets for a in ("--set", s)]]
    env = {**os.environ, "TAXIWAY_HOME": str(home), "OPENBLAS_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
    with tempfile.TemporaryFile() as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        tail = out.read().decode(errors="replace").strip().splitlines()[-6:]
    if proc.returncode:
        sys.exit(f"{' '.join(cmd)} exited {proc.returncode}:\n" + "\n".join(tail))
    return {"seconds": round(seconds, 3), "peak_rss_mib": round(usage.ru_maxrss / 1024, 1), "tail": tail}


def measure(data: Path, workers: int, repeats: int) -> dict:
    """Both stages, ``repeats`` times, each repeat from a cold cache."""
    runs: dict[str, list[dict]] = {s: [] for s in STAGES}
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="scale-") as tmp:
            for stage in STAGES:  # tokenize reads the preflight's outcome from the same run folder
                runs[stage].append(run_stage(stage, data, Path(tmp) / "home", Path(tmp) / "run", workers))
    return {s: {**harness.summary(r), "tail": r[-1]["tail"]} for s, r in runs.items()}


def size_of(data: Path) -> dict:
    files = [p for s in corpus.SPLITS for p in (data / s).iterdir()]
    return {"files": len(files), "mb": round(sum(p.stat().st_size for p in files) / 1e6, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scales", default="10,100")
    ap.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "taxiway-bench-corpora")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = ap.parse_args()
    started = harness.start()
    scales = [int(s) for s in args.scales.split(",")]
    figures: dict = {"workers": args.workers, "repeats": args.repeats, "scales": {}}
    for scale in scales:
        t0 = time.perf_counter()
        data = corpus.build(args.data, scale)
        print(f"x{scale}: corpus ready in {time.perf_counter() - t0:.0f} s: {size_of(data)}", flush=True)
        figures["scales"][f"x{scale}"] = {"corpus": size_of(data), **measure(data, args.workers, args.repeats)}
        print(f"x{scale}: {figures['scales'][f'x{scale}']}", flush=True)
    rows = []
    small, big = (f"x{s}" for s in (scales[0], scales[-1]))
    for stage in STAGES:
        a, b = figures["scales"][small][stage], figures["scales"][big][stage]
        wall, rss = b["median_s"] / a["median_s"], b["peak_rss_mib"] / a["peak_rss_mib"]
        figures[f"{stage}_wall_ratio"], figures[f"{stage}_rss_ratio"] = round(wall, 2), round(rss, 2)
        rows.append([stage, a["median_s"], b["median_s"], f"{wall:.2f} ({'ok' if wall <= WALL_RATIO else 'NOT met'})",
                     a["peak_rss_mib"], b["peak_rss_mib"], f"{rss:.2f} ({'ok' if rss <= RSS_RATIO else 'NOT met'})"])
    table = harness.markdown(["stage", f"{small} wall s", f"{big} wall s", f"wall ratio (<= {WALL_RATIO})",
                              f"{small} peak RSS MiB", f"{big} peak RSS MiB", f"RSS ratio (<= {RSS_RATIO})"], rows)
    corpora = ", ".join(f"{k}: {v['corpus']['files']} files, {v['corpus']['mb']} MB" for k, v in figures["scales"].items())
    notes = (f"CLI stages with --workers {args.workers}, cold cache per repeat, median of {args.repeats}; {corpora}; "
             "peak RSS = largest single process (wait4 ru_maxrss)")
    command = (f".venv/bin/python bench/scale_bench.py --scales {args.scales} --workers {args.workers} "
               f"--repeats {args.repeats}")
    path = harness.write("scale", command, notes, figures, table, args.out, started)
    print(table)
    print(f"wrote {path} and {path.with_suffix('.md')}")


if __name__ == "__main__":
    main()
