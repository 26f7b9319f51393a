"""Refresh benchmark: a refresh of the demo champion on one new batch (10% of the demo corpus's train
files) side by side with the full retrain a user would run instead (the whole pipeline on the base
corpus plus that batch: its tokenizer changes, so everything is encoded again).

Each repeat runs in its own fresh process and ``TAXIWAY_HOME`` (cold caches), with the stage
functions the DAGs call (no Airflow, so scheduling latency is not part of either figure):

1. base: the demo config on 90% of the demo train files → champion (not timed in the ratio);
2. retrain: preflight, tokenize, train, evaluate, register on base + batch (``configs/demo.yaml``);
3. refresh: ``taxiway land`` the batch, then plan, assemble, preflight, tokenize, train
   (``refresh.steps``), evaluate, register — what ``taxiway_refresh`` runs.

Reported: (refresh assemble + preflight + tokenize) / (retrain preflight + tokenize) — the issue's
target is ≤ 0.25 — and both wall times, medians over repeats.

    .venv/bin/python bench/refresh_bench.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "configs" / "demo.yaml"


def _split(home: Path) -> tuple[Path, Path, Path]:
    """The demo corpus (all), the base corpus (``demo-data``: 90% of the train files) and the batch."""
    from pipelines import manifest
    from pipelines.demo_data import write_demo_data

    full = home / "demo-all"
    write_demo_data(full, seed=0)
    train = sorted((full / "train").iterdir())
    new = set(sorted(train, key=lambda p: hashlib.sha256(p.name.encode()).hexdigest())[:len(train) // 10])
    base, batch = home / "demo-data", home / "batch"
    for split in ("train", "val"):
        (base / split).mkdir(parents=True)
    (batch / "train").mkdir(parents=True)
    for path in train:
        shutil.copyfile(path, (batch / "train" if path in new else base / "train") / path.name)
    for path in (full / "val").iterdir():
        shutil.copyfile(path, base / "val" / path.name)
    manifest.write(base / "manifest.jsonl", manifest.scan(base))
    return full, base, batch


def _timed(out: dict, name: str, fn):
    start = time.perf_counter()
    value = fn()
    out[name] = round(time.perf_counter() - start, 3)
    return value


def _pipeline(cfg, run_dir: Path, key: str, out: dict, prefix: str) -> dict:
    from pipelines import stages
    from pipelines.refresh.plan import RefreshPlan

    stages.prepare.prepare(cfg, run_dir)
    refresh = RefreshPlan.of_run(run_dir)  # None for the base and the retrain
    report = _timed(out, f"{prefix}.preflight", lambda: stages.preflight.run(cfg, run_dir))
    assert report.passed, report.summary()
    _timed(out, f"{prefix}.tokenize", lambda: stages.tokenize.reduce(cfg, run_dir, refresh))
    _timed(out, f"{prefix}.train", lambda: stages.train.run(cfg, run_dir))
    ev = _timed(out, f"{prefix}.evaluate", lambda: stages.evaluate.run(cfg, run_dir, refresh=refresh))
    return {**_timed(out, f"{prefix}.register", lambda: stages.register.run(cfg, run_dir, key, refresh=refresh)), "passed": ev["passed"],
            "reason": ev["reason"]}


def one(home: Path) -> dict:
    """One repeat in this process (``TAXIWAY_HOME`` = ``home``)."""
    from pipelines import stages
    from pipelines.config import load_config
    from pipelines.refresh import landing

    out: dict = {}
    full, base, batch = _split(home)
    base_cfg = load_config(DEMO)
    _pipeline(base_cfg, home / "runs" / "base", "base", out, "base")

    retrain_cfg = load_config(DEMO, [f"data.train={full / 'train'}", f"data.val={full / 'val'}",
                                     f"data.manifest={full / 'manifest.jsonl'}", "name=retrain",
                                     "registry.model_name=retrain-gpt"])
    started = time.perf_counter()
    retrain = _pipeline(retrain_cfg, home / "runs" / "retrain", "retrain", out, "retrain")
    out["retrain.wall"] = round(time.perf_counter() - started, 3)

    started = time.perf_counter()
    landed = _timed(out, "refresh.land", lambda: landing.land(batch, base_cfg.refresh.landing, "b1"))
    run_dir = home / "runs" / "refresh"
    decision = _timed(out, "refresh.plan", lambda: stages.refresh.plan(base_cfg, run_dir, "refresh"))
    cfg = decision.config
    stages.prepare.prepare(cfg, run_dir)
    summary = _timed(out, "refresh.assemble", lambda: stages.refresh.assemble(run_dir))
    refresh = _pipeline(cfg, run_dir, "refresh", out, "refresh")
    out["refresh.wall"] = round(time.perf_counter() - started, 3)
    out["data_seconds"] = {"retrain": out["retrain.preflight"] + out["retrain.tokenize"],
                           "refresh": out["refresh.assemble"] + out["refresh.preflight"] + out["refresh.tokenize"]}
    packed = json.loads((Path(json.loads((run_dir / "tokenize" / "packed.json").read_text())["path"])
                         / "manifest.json").read_text())
    out["facts"] = {"batch_files": landed.files, "batch_bytes": landed.bytes,
                    "base_train_files": len(list((base / "train").iterdir())),
                    "trained_sources_signed_by_refresh": summary["trained_sources_signed_now"],
                    "dropped_documents": summary["dropped_documents"], "replay": packed["stats"]["replay"],
                    "refresh_gate_passed": refresh["passed"], "refresh_alias": refresh["alias"],
                    "refresh_gate_reason": refresh["reason"],
                    "retrain_gate_passed": retrain["passed"],
                    "refresh_steps": cfg.train.steps, "retrain_steps": retrain_cfg.train.steps}
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--one", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one)))
        return
    runs = []
    for i in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="refresh-bench-") as tmp:
            env = {**os.environ, "TAXIWAY_HOME": tmp}
            env.pop("MLFLOW_TRACKING_URI", None)
            proc = subprocess.run([sys.executable, __file__, "--one", tmp], env=env, capture_output=True, text=True)
            if proc.returncode:
                sys.exit(f"repeat {i} failed:\n{proc.stderr[-4000:]}")
            runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(json.dumps(runs[-1]["data_seconds"]), runs[-1]["refresh.wall"], runs[-1]["retrain.wall"], flush=True)
    ratios = [r["data_seconds"]["refresh"] / r["data_seconds"]["retrain"] for r in runs]
    figures = {
        "data_ratio_refresh_over_retrain": round(statistics.median(ratios), 3),
        "data_ratios": [round(x, 3) for x in ratios],
        "median_seconds": {k: round(statistics.median(r[k] for r in runs), 2) for k in runs[0]
                           if isinstance(runs[0][k], float | int)},
        "median_data_seconds": {k: round(statistics.median(r["data_seconds"][k] for r in runs), 2)
                                for k in ("retrain", "refresh")},
        "facts": runs[0]["facts"], "repeats": runs,
    }
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip()
    result = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "machine": f"{platform.node()} {os.cpu_count()} cores",
              "command": f".venv/bin/python bench/refresh_bench.py --repeats {args.repeats}", "commit": commit,
              "notes": "refresh of the demo champion on 10% of the demo train files vs a full retrain on base + batch",
              "figures": figures}
    (REPO / "bench" / "results" / "refresh.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in figures.items() if k != "repeats"}, indent=2))


if __name__ == "__main__":
    main()
