"""Scale-out of the data stages on the real executor: 1 Celery worker vs 2 (issue 18 item 4).

The production shape of ``bench/celery_load.py`` (CeleryExecutor, PostgreSQL metadata, Redis broker,
a triggerer), each Celery worker with ONE slot, so "2 workers" means two tasks at once, as two machines
would run them. A ``taxiway_train`` run on the generated 10x corpus (``bench/corpus.py``) goes through
``preflight`` (plan → mapped scan shards → gate) and ``tokenize`` (mapped shards → pack); the figure is
the span from the first preflight task's start to the end of ``tokenize.pack``, read from the task
instances' own start/end times (so the trigger and scheduler start-up are outside it, the scheduling of
every task inside it). The run is then marked failed over REST so training does not compete with the
next repeat (which waits until every task process of this one has exited), and the cache is emptied
(every repeat cold). The tokenizer is a fixed ``tokenizer.path``
(trained once on the 1x corpus, outside the span): BPE training is one multi-threaded step that does
not shard, and a deployment refreshing models keeps its tokenizer.

On the 10x corpus the data stages' serial part (plan, gate, tokenizer, pack and the hand-offs
between them: about 5 s) is a fifth of one worker's span; ``--scales 10,100`` also measures the 100x
corpus (about 1 GB), where the mapped work dominates.

    .venv/bin/python bench/scaleout_bench.py [--repeats 3] [--scales 10:3,100:1]   # raw: bench/results/scaleout.json
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus  # noqa: E402
import harness  # noqa: E402

REPO = harness.REPO
sys.path[:0] = [str(REPO / "tests"), str(REPO)]

from live_airflow import CeleryShape, LiveAirflow, wait_for  # noqa: E402
from postgres import fresh_db, pg_uri  # noqa: E402

DAG = "taxiway_train"
TINY = REPO / "configs" / "tiny.yaml"
TARGET = 1.6
STAGES = ("preflight.", "tokenize.")
LAST = "tokenize.pack"


def _ts(value: str) -> float:
    return datetime.fromisoformat(value).timestamp()


def task_instances(live: LiveAirflow, run_id: str) -> list[dict]:
    """Every task instance of the run, mapped ones one row per map index (page by page: the API
    returns at most ``[api] maximum_page_limit``, 100, whatever ``limit`` asks)."""
    rows: list[dict] = []
    while True:
        resp = live.api.get(f"/api/v2/dags/{DAG}/dagRuns/{run_id}/taskInstances",
                            params={"limit": 100, "offset": len(rows), "order_by": "id"})
        resp.raise_for_status()
        body = resp.json()
        rows += body["task_instances"]
        if not body["task_instances"] or len(rows) >= body["total_entries"]:
            return rows


def _task_processes() -> list[int]:
    """Processes running a task: the task processes Airflow's supervisors fork (titled ``airflow
    worker -- <id>``; a Celery pool process keeps its ``airflow supervisor`` title between tasks)
    and what they started (the trainer)."""
    import psutil

    found = []
    for proc in psutil.process_iter(["cmdline"]):
        line = " ".join(proc.info["cmdline"] or [])
        if line.startswith("airflow worker -- ") or " -m trainer " in f"{line} ":
            found.append(proc.pid)
    return found


def tokenizer(one: Path, out: Path) -> Path:
    """The tiny config's tokenizer trained on the 1x train split: the run's fixed ``tokenizer.path``."""
    from pipelines.config import load_config
    from pipelines.tokenize import bpe

    if not out.is_file():
        cfg = load_config(TINY)
        texts = (p.read_text() for p in sorted((one / "train").iterdir()))
        bpe.train(texts, cfg.tokenizer).save(str(out))
    return out


def one_run(live: LiveAirflow, conf: dict) -> dict:
    """Trigger, wait for ``tokenize.pack``, stop the run; the data stages' span and task times."""
    resp = live.trigger(DAG, conf)
    resp.raise_for_status()
    run_id = resp.json()["dag_run_id"]

    def packed():
        tis = {t["task_id"]: t for t in task_instances(live, run_id) if t["map_index"] in (-1, 0)}
        state = tis.get(LAST, {}).get("state")
        if state in ("failed", "upstream_failed"):  # a failure upstream reaches the last task as upstream_failed
            raise RuntimeError(f"run {run_id} failed before {LAST}: "
                               + str({k: v["state"] for k, v in tis.items()}))
        return state == "success"

    # one light REST call every 2 s: the span comes from the task instances' own times, and a busier
    # poll would take the api-server's CPU from the tasks being measured
    wait_for(f"{LAST} of {run_id}", packed, timeout_s=1200, every_s=2)
    live.api.patch(f"/api/v2/dags/{DAG}/dagRuns/{run_id}", json={"state": "failed"}).raise_for_status()
    wait_for(f"the tasks of {run_id} to stop", lambda: not any(  # the next repeat gets an idle machine
        t["state"] in ("running", "queued", "deferred") for t in task_instances(live, run_id)), 120, every_s=1)
    # a task's state is final before its process has gone: the supervisor kills a task of a run marked
    # failed at its next heartbeat, and meanwhile the smoke test (queued when pack succeeded) kept one
    # of two workers busy into the next repeat's span
    wait_for(f"the task processes of {run_id} to exit", lambda: not _task_processes(), 120, every_s=0.5)
    tis = [t for t in task_instances(live, run_id) if t["task_id"].startswith(STAGES) and t["start_date"]]
    start = min(_ts(t["start_date"]) for t in tis)
    end = max(_ts(t["end_date"]) for t in tis if t["task_id"] == LAST)
    busy = sum(_ts(t["end_date"]) - _ts(t["start_date"]) for t in tis if t["end_date"])
    return {"run_id": run_id, "start": datetime.fromtimestamp(start, UTC).isoformat(),
            "span_s": round(end - start, 2), "task_seconds": round(busy, 2),
            "tasks": sorted([t["task_id"] + (f"[{t['map_index']}]" if t["map_index"] >= 0 else ""),
                             round(_ts(t["start_date"]) - start, 2), round(_ts(t["end_date"]) - start, 2)]
                            for t in tis if t["end_date"])}


def measure(workers: int, repeats: int, data: Path, tok: Path, root: Path) -> list[dict]:
    """A fresh deployment with ``workers`` one-slot Celery workers; ``repeats`` cold runs."""
    import redis

    db_number = random.randint(1, 15)
    broker = redis.Redis(host="127.0.0.1", port=6379, db=db_number)
    broker.flushdb()
    runs = []
    home = root / f"workers-{workers}" / "taxiway"  # LiveAirflow's TAXIWAY_HOME
    with fresh_db("taxiway_airflow") as metadata:
        live = LiveAirflow(root / f"workers-{workers}",
                           extra_env={"TAXIWAY_CONFIG": str(TINY),  # the corpus, and the deployment's own home
                                      "TAXIWAY_DATA_ROOTS": os.pathsep.join([str(data.parent), str(home)])},
                           celery=CeleryShape(pg_uri(metadata), f"redis://127.0.0.1:6379/{db_number}",
                                              workers=workers, concurrency=1))
        live.start()
        try:
            live.wait_dag(DAG)
            live.unpause(DAG)
            conf = {"data": {"train": str(data / "train"), "val": str(data / "val"),
                             "manifest": str(data / "manifest.jsonl")}, "tokenizer": {"path": str(tok)}}
            for _ in range(repeats):
                shutil.rmtree(live.taxiway_home / "cache", ignore_errors=True)
                runs.append(one_run(live, conf))
                print(f"{workers} worker(s): {runs[-1]['span_s']} s", flush=True)
        finally:
            live.stop()
            broker.flushdb()
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--scales", default="10", help="comma-separated corpus scales (bench/corpus.py), each with "
                                                   "its own repeats after a colon if not --repeats: 10:3,100:1")
    ap.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "taxiway-bench-corpora")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = ap.parse_args()
    started = harness.start()
    tok = tokenizer(corpus.build(args.data, 1), args.data / "tiny-tokenizer.json")
    root = Path(tempfile.mkdtemp(prefix="scaleout-"))
    figures: dict = {"scales": {}}
    rows = []
    for item in args.scales.split(","):
        scale, _, repeats = item.partition(":")
        scale, repeats = int(scale), int(repeats or args.repeats)
        data = corpus.build(args.data, scale)
        runs = {w: measure(w, repeats, data, tok, root / f"x{scale}") for w in (1, 2)}
        medians = {w: statistics.median(r["span_s"] for r in runs[w]) for w in runs}
        speedup = round(medians[1] / medians[2], 2)
        figures["scales"][f"x{scale}"] = {"speedup": speedup, "workers": {
            str(w): {"median_span_s": medians[w], "runs": runs[w]} for w in runs}}
        rows += [[f"x{scale}", w, medians[w], [r["span_s"] for r in runs[w]],
                  "1.00" if w == 1 else f"{speedup:.2f} ({'ok' if speedup >= TARGET else 'NOT met'}, target >= {TARGET})"]
                 for w in (1, 2)]
    table = harness.markdown(["corpus", "Celery workers (1 slot each)", "preflight + tokenize span, median s",
                              "spans s", "speedup"], rows)
    notes = ("CeleryExecutor, PostgreSQL metadata, Redis broker, the production config: section "
             "(deploy/airflow-values.yaml); tiny config with a fixed tokenizer.path; generated corpora; "
             "span = first preflight task start -> tokenize.pack end; cold cache each run")
    path = harness.write("scaleout", f".venv/bin/python bench/scaleout_bench.py --repeats {args.repeats} "
                         f"--scales {args.scales}", notes, figures, table, args.out, started)
    shutil.rmtree(root, ignore_errors=True)
    print(table)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
