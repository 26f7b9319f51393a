"""Scale-out of the data stages on the real executor: 1 Celery worker vs 2 (issue 18 item 4).

The production shape of ``bench/celery_load.py`` (CeleryExecutor, PostgreSQL metadata, Redis broker,
a triggerer), each Celery worker with ONE slot, so "2 workers" means two tasks at once, as two machines
would run them. A ``taxiway_train`` run on the generated 10x corpus (``bench/corpus.py``) goes through
``preflight`` (plan → mapped scan shards → gate) and ``tokenize`` (mapped shards → pack); the figure is
the span from the first preflight task's start to the end of ``tokenize.pack``, read from the task
instances' own start/end times (so the trigger and scheduler start-up are outside it, the scheduling of
every task inside it). The run is then marked failed over REST so training does not compete with the
next run (which waits until every task process of this one has exited), and the cache is emptied
(every run cold). The tokenizer is a fixed ``tokenizer.path`` (trained once on the 1x corpus, outside
the span): BPE training is one multi-threaded step that does not shard, and a deployment refreshing
models keeps its tokenizer.

One deployment with two workers serves both sides, round by round: for a 1-worker run the second
worker stops consuming the task queue (Celery's ``cancel_consumer``, what ``airflow celery
remove-queue`` sends), for a 2-worker run it consumes it again; each round runs both, in alternating
order. A VM's speed drifts by tens of percent over minutes (neighbours), so the figure is the median
of the rounds' paired ratios, beside the ratio of the medians. Each round also measures two ceilings
at that moment, with the idle deployment beside them: the machine's (one CPU-bound loop alone vs two
at once) and the stages' own without Airflow (``taxiway preflight`` + ``taxiway tokenize`` with
``--workers 1`` pinned to one core vs ``--workers 2`` on two). Every run on either side must pack
the same dataset (key, and the splits with every shard file's sha256), or the bench fails.

    .venv/bin/python bench/scaleout_bench.py [--repeats 5] [--scales 10:5,100:1]   # raw: bench/results/scaleout.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus  # noqa: E402
import harness  # noqa: E402

REPO = harness.REPO
sys.path[:0] = [str(REPO / "deploy" / "local"), str(REPO / "tests"), str(REPO)]

from live_airflow import CeleryShape, LiveAirflow, wait_for  # noqa: E402
from postgres import fresh_db, pg_uri  # noqa: E402
from redis_server import redis_url  # noqa: E402

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


def packed(manifest: Path) -> dict:
    """What a run packed, to check every run and method gave the same dataset: its key and a digest of
    its splits (documents, tokens, windows and every shard file's sha256)."""
    body = json.loads(manifest.read_text())
    return {"key": body["key"], "splits_sha256": hashlib.sha256(
        json.dumps(body["splits"], sort_keys=True).encode()).hexdigest()}


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """How many of the tasks ran at the same time at most: 1 on one one-slot worker (the check that
    the second worker really stayed out), 2 when both took part."""
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])  # an end before a start
    running = most = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most


def one_run(live: LiveAirflow, conf: dict) -> dict:
    """Trigger, wait for ``tokenize.pack``, stop the run; the data stages' span and task times."""
    resp = live.trigger(DAG, conf)
    resp.raise_for_status()
    run_id = resp.json()["dag_run_id"]

    def done():
        resp = live.api.get(f"/api/v2/dags/{DAG}/dagRuns/{run_id}/taskInstances/{LAST}")
        if resp.status_code == 404:  # not created yet
            return False
        resp.raise_for_status()
        state = resp.json()["state"]
        if state in ("failed", "upstream_failed"):  # a failure upstream reaches the last task as upstream_failed
            raise RuntimeError(f"run {run_id} failed before {LAST}: " + str(
                {t["task_id"]: t["state"] for t in task_instances(live, run_id)}))
        return state == "success"

    # one light REST call (one task instance) every 2 s: the span comes from the task instances' own
    # times, and a busier poll would take the api-server's CPU from the tasks being measured
    wait_for(f"{LAST} of {run_id}", done, timeout_s=1200, every_s=2)
    pointer = live.api.get(f"/api/v2/dags/{DAG}/dagRuns/{run_id}/taskInstances/{LAST}/xcomEntries/return_value",
                           params={"deserialize": True})
    pointer.raise_for_status()
    dataset = packed(Path(pointer.json()["value"]["path"]) / "manifest.json")  # before the next run empties the cache
    live.api.patch(f"/api/v2/dags/{DAG}/dagRuns/{run_id}", json={"state": "failed"}).raise_for_status()
    wait_for(f"the tasks of {run_id} to stop", lambda: not any(  # the next run gets an idle machine
        t["state"] in ("running", "queued", "deferred") for t in task_instances(live, run_id)), 120, every_s=1)
    # a task's state is final before its process has gone: the supervisor kills a task of a run marked
    # failed at its next heartbeat, and meanwhile the smoke test (queued when pack succeeded) kept one
    # of two workers busy into the next run's span
    wait_for(f"the task processes of {run_id} to exit", lambda: not _task_processes(), 120, every_s=0.5)
    tis = [t for t in task_instances(live, run_id) if t["task_id"].startswith(STAGES) and t["start_date"]]
    start = min(_ts(t["start_date"]) for t in tis)
    end = max(_ts(t["end_date"]) for t in tis if t["task_id"] == LAST)
    busy = sum(_ts(t["end_date"]) - _ts(t["start_date"]) for t in tis if t["end_date"])
    return {"run_id": run_id, "start": datetime.fromtimestamp(start, UTC).isoformat(),
            "span_s": round(end - start, 2), "task_seconds": round(busy, 2), "packed": dataset,
            "most_at_once": most_at_once([(_ts(t["start_date"]), _ts(t["end_date"])) for t in tis if t["end_date"]]),
            "tasks": sorted([t["task_id"] + (f"[{t['map_index']}]" if t["map_index"] >= 0 else ""),
                             round(_ts(t["start_date"]) - start, 2), round(_ts(t["end_date"]) - start, 2)]
                            for t in tis if t["end_date"])}


class Workers:
    """Turns the second Celery worker's consumption of the task queue off and on (Celery remote
    control, as ``airflow celery remove-queue`` / ``add-queue`` do), checked by asking the workers."""

    QUEUE = "default"  # [operators] default_queue

    def __init__(self, broker_url: str) -> None:
        from celery import Celery

        self.app = Celery(broker=broker_url)
        wait_for("both Celery workers to answer", lambda: len(self._names()) == 2, 120, every_s=1)
        self.second = next(n for n in self._names() if n.startswith("w2@"))

    def _names(self) -> list[str]:
        return sorted(r for reply in self.app.control.ping(timeout=1.0) for r in reply)

    def _consuming(self) -> bool:
        queues = self.app.control.inspect(destination=[self.second], timeout=2.0).active_queues() or {}
        return any(q["name"] == self.QUEUE for q in queues.get(self.second, []))

    def use(self, count: int) -> None:
        if count == 2:
            self.app.control.add_consumer(self.QUEUE, destination=[self.second], reply=True)
        else:
            self.app.control.cancel_consumer(self.QUEUE, destination=[self.second], reply=True)
        wait_for(f"{self.second} to {'consume' if count == 2 else 'leave'} {self.QUEUE}",
                 lambda: self._consuming() == (count == 2), 30, every_s=0.5)


def _spin(_: int) -> float:
    started, total = time.perf_counter(), 0
    for i in range(8_000_000):
        total += i
    return time.perf_counter() - started


def machine_ceiling() -> dict:
    """The speed-up two processes get on this machine right now: one CPU-bound loop alone, then two
    at once (fresh processes each; the idle deployment runs beside them as it does beside the tasks)."""
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        alone = min(pool.map(_spin, range(2)))  # the first loop of a fresh process warms nothing up: min of 2
    with ctx.Pool(2) as pool:
        pool.map(_spin, [0, 0])  # both processes started and imported before the timed pair
        started = time.perf_counter()
        pool.map(_spin, [0, 1], chunksize=1)
        pair = time.perf_counter() - started
    return {"alone_s": round(alone, 3), "pair_s": round(pair, 3), "speedup": round(2 * alone / pair, 2)}


def plain_stages(data: Path, tok: Path, workers: int, scratch: Path) -> dict:
    """The same two stages without Airflow, as a user would run them on one machine: ``taxiway
    preflight --workers N`` then ``taxiway tokenize --workers N``, fresh processes pinned to N cores
    (a worker is a core), an empty cache of their own; seconds of both together and what was packed."""
    taxiway = Path(sys.executable).parent / "taxiway"
    env = {**os.environ, "TAXIWAY_HOME": str(scratch), "PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1",
           "TAXIWAY_DATA_ROOTS": os.pathsep.join([str(data.parent), str(scratch)])}
    env.pop("TAXIWAY_CONFIG", None)
    cores = set(sorted(os.sched_getaffinity(0))[:workers])
    sets = ["-s", f"data.train={data / 'train'}", "-s", f"data.val={data / 'val'}",
            "-s", f"data.manifest={data / 'manifest.jsonl'}", "-s", f"tokenizer.path={tok}"]
    shutil.rmtree(scratch, ignore_errors=True)
    started = time.perf_counter()
    for stage in ("preflight", "tokenize"):
        proc = subprocess.run([str(taxiway), stage, "-c", str(TINY), *sets, "--run-dir", str(scratch / "run"),
                               "--workers", str(workers)], capture_output=True, text=True, env=env,
                              preexec_fn=lambda: os.sched_setaffinity(0, cores))
        if proc.returncode:
            raise RuntimeError(f"taxiway {stage} --workers {workers} failed:\n{proc.stderr[-4000:]}")
    seconds = time.perf_counter() - started
    dataset = packed(Path(proc.stdout.strip().splitlines()[-1]))  # tokenize's last line: the manifest
    shutil.rmtree(scratch, ignore_errors=True)
    return {"seconds": round(seconds, 2), "packed": dataset}


def measure(rounds: int, data: Path, tok: Path, root: Path) -> list[dict]:
    """A fresh deployment with two one-slot Celery workers; ``rounds`` rounds of a cold run on one worker
    and one on both, in alternating order, each round with both ceilings."""
    broker_url = redis_url()
    out = []
    home = root / "taxiway"  # LiveAirflow's TAXIWAY_HOME
    with fresh_db("taxiway_airflow") as metadata:
        live = LiveAirflow(root, extra_env={"TAXIWAY_CONFIG": str(TINY),  # the corpus, and the deployment's own home
                                            "TAXIWAY_DATA_ROOTS": os.pathsep.join([str(data.parent), str(home)])},
                           celery=CeleryShape(pg_uri(metadata), broker_url, workers=2, concurrency=1))
        live.start()
        try:
            live.wait_dag(DAG)
            live.unpause(DAG)
            workers = Workers(broker_url)
            conf = {"data": {"train": str(data / "train"), "val": str(data / "val"),
                             "manifest": str(data / "manifest.jsonl")}, "tokenizer": {"path": str(tok)}}
            for index in range(rounds):
                runs = {}
                for count in ((1, 2) if index % 2 == 0 else (2, 1)):
                    workers.use(count)
                    shutil.rmtree(live.taxiway_home / "cache", ignore_errors=True)
                    runs[count] = one_run(live, conf)
                    if runs[count]["most_at_once"] > count:
                        raise RuntimeError(f"{runs[count]['run_id']}: {runs[count]['most_at_once']} tasks at once "
                                           f"on {count} one-slot worker(s)")
                    print(f"round {index + 1}: {count} worker(s): {runs[count]['span_s']} s", flush=True)
                ceiling = machine_ceiling()
                plain = {str(n): plain_stages(data, tok, n, root / "plain") for n in (1, 2)}
                datasets = {json.dumps(r["packed"], sort_keys=True) for r in [*runs.values(), *plain.values()]}
                if len(datasets) != 1 or (out and datasets != {json.dumps(out[0]["packed"], sort_keys=True)}):
                    raise RuntimeError(f"round {index + 1}: the runs packed different datasets: {sorted(datasets)}")
                plain_s = {n: p["seconds"] for n, p in plain.items()}
                out.append({"round": index + 1, "speedup": round(runs[1]["span_s"] / runs[2]["span_s"], 2),
                            "machine_ceiling": ceiling, "packed": runs[1]["packed"],
                            "plain_stages": {"seconds": plain_s, "speedup": round(plain_s["1"] / plain_s["2"], 2)},
                            "runs": {str(c): r for c, r in runs.items()}})
                print(f"round {index + 1}: {out[-1]['speedup']}x; two processes of a CPU loop: "
                      f"{ceiling['speedup']}x; the stages without Airflow on 1 / 2 cores: {plain_s['1']} / "
                      f"{plain_s['2']} s, {out[-1]['plain_stages']['speedup']}x", flush=True)
        finally:
            live.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5, help="rounds")
    ap.add_argument("--scales", default="10", help="comma-separated corpus scales (bench/corpus.py), each with "
                                                   "its own rounds after a colon if not --repeats: 10:5,100:1")
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
        rounds = measure(repeats, data, tok, root / f"x{scale}")
        spans = {w: [r["runs"][str(w)]["span_s"] for r in rounds] for w in (1, 2)}
        medians = {w: statistics.median(spans[w]) for w in spans}
        paired = statistics.median(r["speedup"] for r in rounds)
        ceiling = statistics.median(r["machine_ceiling"]["speedup"] for r in rounds)
        plain = statistics.median(r["plain_stages"]["speedup"] for r in rounds)
        figures["scales"][f"x{scale}"] = {
            "speedup": round(paired, 2), "ratio_of_medians": round(medians[1] / medians[2], 2),
            "machine_ceiling": ceiling, "plain_stages_speedup": plain, "median_span_s": {str(w): medians[w] for w in medians}, "rounds": rounds}
        rows.append([f"x{scale}", medians[1], medians[2], [r["speedup"] for r in rounds],
                     f"{paired:.2f} ({'ok' if paired >= TARGET else 'NOT met'}, target >= {TARGET})",
                     round(medians[1] / medians[2], 2), plain, ceiling])
    table = harness.markdown(["corpus", "1 worker: span, median s", "2 workers: span, median s",
                              "speed-up per round", "speed-up, median of rounds", "ratio of medians",
                              "the stages without Airflow, 1 -> 2 cores, median", "two CPU loops at once, median"], rows)
    notes = ("CeleryExecutor, PostgreSQL metadata, Redis broker, the production config: section "
             "(deploy/airflow-values.yaml); tiny config with a fixed tokenizer.path; generated corpora; "
             "span = first preflight task start -> tokenize.pack end; cold cache each run; one deployment, "
             "rounds of a 1-worker and a 2-worker run in alternating order (cancel_consumer / add_consumer); "
             "every run and the plain stages packed the same dataset (key and splits, shard sha256s included)")
    path = harness.write("scaleout", f".venv/bin/python bench/scaleout_bench.py --repeats {args.repeats} "
                         f"--scales {args.scales}", notes, figures, table, args.out, started)
    shutil.rmtree(root, ignore_errors=True)
    print(table)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
