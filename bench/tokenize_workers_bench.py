"""The tokenize stage spread over worker processes: ``taxiway tokenize --workers N``, 1 vs 2.

Each measurement is the whole stage in a fresh ``taxiway`` process (imports, plan, the shards on N
one-thread processes, pack), timed from start to exit, with an empty cache of its own. The process
tree is pinned to N cores (a worker is a core, as a Celery worker slot or a pod would be); the
unsharded stage (no ``--workers``: one process encoding on every core of the machine) is measured
beside it. Same corpora and tokenizer as ``tokenize_bench.py`` (8192-token BPE; x1 the demo corpus,
x10 ten copies under other names); every run's packed dataset is checked identical (the manifest's
splits, sha256 of every shard included). Target: 2 workers >= 1.6x 1 worker at x10.

    .venv/bin/python bench/tokenize_workers_bench.py [--repeats 3] [--corpora x10] [--out bench/results]

writes ``tokenize_workers.json`` (raw figures) and ``tokenize_workers.md`` (the table) in ``--out``.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
import tokenize_bench  # noqa: E402

REPO = harness.REPO
TAXIWAY = Path(sys.executable).parent / "taxiway"


def one_run(data: Path, tok: Path, workers: int | None, scratch: Path) -> dict:
    """The stage in a fresh process on ``workers`` cores (None: unsharded, every core); seconds and
    the packed dataset's splits."""
    env = {**os.environ, "TAXIWAY_HOME": str(scratch), "PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1"}
    cores = sorted(os.sched_getaffinity(0))
    pinned = set(cores[:workers]) if workers else set(cores)
    args = [str(TAXIWAY), "tokenize", "-c", str(REPO / "configs" / "tiny.yaml"),
            "-s", f"data.train={data / 'train'}", "-s", f"data.val={data / 'val'}",
            "-s", f"data.manifest={data / 'manifest.jsonl'}", "-s", f"tokenizer.path={tok}",
            "-s", f"pack.seq_len={tokenize_bench.SEQ_LEN}", "-s", f"model.block_size={tokenize_bench.SEQ_LEN}",
            *(["--workers", str(workers)] if workers else [])]
    started = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True, env=env,
                          preexec_fn=lambda: os.sched_setaffinity(0, pinned))
    seconds = time.perf_counter() - started
    if proc.returncode:
        sys.exit(f"taxiway tokenize --workers {workers} failed:\n{proc.stderr[-4000:]}")
    manifest = json.loads(Path(proc.stdout.strip().splitlines()[-1]).read_text())
    return {"seconds": seconds, "splits": manifest["splits"], "key": manifest["key"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--corpora", default="x10")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = ap.parse_args()
    started = harness.start()
    figures: dict = {"repeats": args.repeats, "corpora": {}}
    datasets = set()
    with tempfile.TemporaryDirectory() as tmp:
        corpora = tokenize_bench.build(Path(tmp))
        tok = Path(tmp) / "tokenizer.json"
        for name in args.corpora.split(","):
            row: dict = {}
            for workers in (1, 2, None):
                runs = []
                for i in range(args.repeats):
                    runs.append(one_run(corpora[name], tok, workers, Path(tmp) / f"home-{name}-{workers}-{i}"))
                    datasets.add((name, runs[-1]["key"], json.dumps(runs[-1]["splits"], sort_keys=True)))
                seconds = [r["seconds"] for r in runs]
                row[f"workers_{workers}" if workers else "unsharded"] = {
                    "median_s": round(statistics.median(seconds), 3), "runs_s": [round(s, 3) for s in seconds]}
            row["two_over_one"] = round(row["workers_1"]["median_s"] / row["workers_2"]["median_s"], 3)
            figures["corpora"][name] = row
            print(json.dumps({name: row}), flush=True)
    figures["same_dataset_every_run"] = len(datasets) == len(figures["corpora"])
    rows = [[name, label, r[label]["median_s"], r[label]["runs_s"]] for name, r in figures["corpora"].items()
            for label in ("workers_1", "workers_2", "unsharded")]
    table = (harness.markdown(["corpus", "run", "median s", "runs s"], rows)
             + "".join(f"\n{name}: 2 workers / 1 worker = **{r['two_over_one']}x** (target >= 1.6)\n"
                       for name, r in figures["corpora"].items())
             + f"\nSame packed dataset in every run: {'yes' if figures['same_dataset_every_run'] else '**NO**'}.\n")
    notes = ("Whole `taxiway tokenize` in a fresh process, timed from start to exit, empty cache each run; "
             "`--workers N` pinned to N cores, unsharded on every core.")
    command = f".venv/bin/python bench/tokenize_workers_bench.py --repeats {args.repeats} --corpora {args.corpora}"
    path = harness.write("tokenize_workers", command, notes, figures, table, args.out, started)
    print(table)
    print(f"wrote {path} and {path.with_suffix('.md')} in {time.perf_counter() - started['t0']:.0f} s")


if __name__ == "__main__":
    main()
