"""A chain of three refreshes on three distinct batches, ``refresh.schedule: rewarm`` side by side with
``wsd``, from the same initial champion with the same seeds (issue 35, item 5).

Data (nothing downloaded): the interpreter's standard-library sources, as the demo corpus. Three
packages are cut out of it as the batches, one topic each (``asyncio``, ``email``, ``xml``); the
rest is the base corpus (its val split is the fixed validation set). Config: ``configs/demo.yaml``
(4 layers, 128 wide, seq 128, 2 local nodes), champion 300 steps; each refresh ``refresh.steps``
200 with 20 steps of (re-)warmup; ``wsd`` decays the last 40; ``fresh_eval_fraction`` 0.2.

The stage front doors the DAGs call, in this process (no Airflow): the base champion is trained and
registered once and its run folder copied into each schedule's own ``TAXIWAY_HOME`` (own MLflow
registry, shared token cache), where it is registered with the same config. Then per schedule and
batch: ``taxiway land``, plan, assemble, preflight, tokenize, train, evaluate, register. Each
candidate is made champion whatever the gate said (the chain measures the schedule, not the gate;
the verdict is recorded), so each refresh continues the one before.

Per refresh: the new-data gain (bits/byte on the batch's held-out slice, parent → candidate) and
forgetting (the fixed validation set and each earlier batch's held-out slice, parent → candidate),
read from the refresh's eval report. Raw results: ``bench/results/refresh_chain.json``; the log (one
line per refresh, and any warning) is what the command writes to stderr:

    .venv/bin/python bench/refresh_chain.py [--work DIR] 2> bench/results/refresh_chain.log
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "configs" / "demo.yaml"
BATCHES = ("asyncio", "email", "xml")  # stdlib packages, one batch each, in landing order
SCHEDULES = ("rewarm", "wsd")
REFRESH = {"steps": 200, "warmup_steps": 20, "decay_steps": 40, "fresh_eval_fraction": 0.2}


def _refresh(lr: float | None) -> dict:
    """The refresh section of both chains; ``lr``: refresh.lr (unset: train.lr)."""
    return {**REFRESH, **({"lr": lr} if lr else {})}


def _config(home: Path, schedule: str, lr: float | None = None) -> Path:
    """The deployment's config for one chain: demo.yaml, the refresh section above, ``schedule``."""
    body = "\n".join(f"  {k}: {v}" for k, v in {**_refresh(lr), "schedule": schedule}.items())
    path = home / "deployment.yaml"
    path.write_text(f"extends: {DEMO}\nrefresh:\n{body}\n")
    return path


def _corpus(root: Path) -> None:
    """``root/demo-data`` (the stdlib minus the batches' packages) and ``root/batch-<package>/train``."""
    from pipelines import manifest
    from pipelines.demo_data import write_demo_data

    full = root / "all"
    write_demo_data(full, seed=0)
    base = root / "demo-data"
    for split in ("train", "val"):
        (base / split).mkdir(parents=True)
        for path in sorted((full / split).iterdir()):
            package = path.name.split("__", 1)[0] if "__" in path.name else None
            dest = root / f"batch-{package}" / "train" if package in BATCHES else base / split
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest / path.name)
    manifest.write(base / "manifest.jsonl", manifest.scan(base))


def _stages(cfg, run_dir: Path, key: str, refresh=None) -> dict:
    from pipelines import stages

    stages.prepare.prepare(cfg, run_dir)
    assert stages.preflight.run(cfg, run_dir).passed
    stages.tokenize.reduce(cfg, run_dir, refresh)
    stages.train.run(cfg, run_dir)
    stages.evaluate.run(cfg, run_dir, refresh=refresh)
    return stages.register.run(cfg, run_dir, key, refresh=refresh)


def base(root: Path) -> None:
    """The initial champion, trained once (``root`` is its ``TAXIWAY_HOME``)."""
    from pipelines.config import load_config

    _corpus(root)
    _stages(load_config(_config(root, "rewarm")), root / "runs" / "base", "base")


def chain(home: Path, root: Path, schedule: str, lr: float | None) -> list[dict]:
    """Three refreshes under ``schedule`` in ``home`` (its own registry), from ``root``'s champion."""
    from pipelines import registry, stages
    from pipelines.config import load_config
    from pipelines.refresh import landing
    from pipelines.refresh.plan import RefreshPlan

    for name in ("demo-data", "cache"):
        (home / name).symlink_to(root / name, target_is_directory=True)
    shutil.copytree(root / "runs" / "base", home / "runs" / "base", symlinks=True)
    cfg = load_config(_config(home, schedule, lr))
    champion = home / "runs" / "base"  # registered with the config it was trained with: its checkpoint is found
    first = stages.register.run(stages.prepare.load_run_config(champion), champion, "base")
    assert first["alias"] == "champion", first
    out = []
    for batch in BATCHES:
        started = time.perf_counter()
        landing.land(root / f"batch-{batch}", cfg.refresh.landing, batch)
        run_dir = home / "runs" / f"refresh-{batch}"
        decision = stages.refresh.plan(cfg, run_dir, f"refresh-{batch}")
        stages.prepare.prepare(decision.config, run_dir)
        stages.refresh.assemble(run_dir)
        registered = _stages(decision.config, run_dir, f"refresh-{batch}", RefreshPlan.load(run_dir))
        c = registry.client()  # the chain goes on from this candidate whatever the gate said
        c.set_registered_model_alias(cfg.registry.model_name, cfg.registry.champion_alias, registered["version"])
        report = json.loads((run_dir / "eval" / "report.json").read_text())
        model = json.loads((run_dir / "model" / "model.json").read_text())
        fresh = report["refresh"]["fresh"]
        out.append({"batch": batch, "parent": decision.config.parent, "version": registered["version"],
                    "gate_passed": report["passed"], "gate_alias": registered["alias"],
                    "new_data": {"parent_bpb": fresh["baseline"]["bits_per_byte"],
                                 "candidate_bpb": fresh["candidate"]["bits_per_byte"]},
                    "forgetting": report["forgetting"], "global_step": model["global_step"],
                    "stable_step": model.get("stable_step"), "final_lr": model["final_lr"],
                    "continued": _continued(run_dir), "seconds": round(time.perf_counter() - started, 1)})
        print(json.dumps({"schedule": schedule, **out[-1]}), file=sys.stderr, flush=True)
    return out


def _continued(run_dir: Path) -> dict:
    """The parent state the trainer loaded (its ``parent_loaded`` event)."""
    for line in (run_dir / "events.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event.get("event") == "parent_loaded":
            return {k: event.get(k) for k in ("global_step", "start_lr", "optimizer_state")}
    return {}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", type=Path, help="keep the homes here (default: a temporary folder)")
    parser.add_argument("--refresh-lr", type=float, help="refresh.lr of both chains (default: unset, train.lr)")
    parser.add_argument("--part", nargs=2, help=argparse.SUPPRESS)  # base ROOT | SCHEDULE ROOT, in a child process
    args = parser.parse_args()
    if args.part:
        what, root = args.part[0], Path(args.part[1])
        if what == "base":
            base(root)
        else:
            print(json.dumps(chain(Path(os.environ["TAXIWAY_HOME"]), root, what, args.refresh_lr)))
        return
    work = args.work or Path(tempfile.mkdtemp(prefix="refresh-chain-"))
    started = time.perf_counter()
    root = work / "base"

    def part(what: str, home: Path) -> str:
        home.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "TAXIWAY_HOME": str(home)}
        env.pop("MLFLOW_TRACKING_URI", None)
        print(f"{datetime.now(UTC).isoformat(timespec='seconds')} {what} starts", file=sys.stderr, flush=True)
        lr = ["--refresh-lr", str(args.refresh_lr)] if args.refresh_lr else []
        proc = subprocess.run([sys.executable, __file__, "--part", what, str(root), *lr], env=env, stdout=subprocess.PIPE,
                              text=True)  # its stderr (one line per refresh, warnings) goes to ours: the log
        if proc.returncode:
            sys.exit(f"{what} failed (exit {proc.returncode})")
        return proc.stdout

    part("base", root)
    chains = {s: json.loads(part(s, work / s).strip().splitlines()[-1]) for s in SCHEDULES}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip()
    name = f"refresh_chain-lr{args.refresh_lr:g}" if args.refresh_lr else "refresh_chain"
    flag = f" --refresh-lr {args.refresh_lr:g}" if args.refresh_lr else ""
    result = {"date": datetime.now(UTC).isoformat(timespec="seconds"),
              "machine": f"{platform.node()} {os.cpu_count()} cores", "commit": commit,
              "command": f".venv/bin/python bench/refresh_chain.py{flag} 2> bench/results/{name}.log",
              "wall_s": round(time.perf_counter() - started, 1),
              "config": {"extends": "configs/demo.yaml", "champion_steps": 300, "refresh": _refresh(args.refresh_lr),
                         "batches": list(BATCHES)},
              "chains": chains}
    (REPO / "bench" / "results" / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))


def table(result: dict) -> str:
    """The side-by-side table for docs/refresh.md (bits/byte, parent → candidate)."""
    lines = ["| refresh | set | rewarm | wsd |", "|---|---|---|---|"]
    for i, batch in enumerate(BATCHES):
        runs = {s: result["chains"][s][i] for s in SCHEDULES}

        def cell(p: float, c: float) -> str:
            return f"{p:.3f} → {c:.3f} ({c - p:+.3f})"

        lines.append(f"| {i + 1} ({batch}) | new data: {batch} held-out | "
                     + " | ".join(cell(r["new_data"]["parent_bpb"], r["new_data"]["candidate_bpb"]) for r in runs.values()) + " |")
        for k, row in enumerate(runs["rewarm"]["forgetting"]["sets"]):
            cells = [runs[s]["forgetting"]["sets"][k] for s in SCHEDULES]
            lines.append(f"| | forgetting: {row['set']} | "
                         + " | ".join(cell(r["parent_bpb"], r["candidate_bpb"]) for r in cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
