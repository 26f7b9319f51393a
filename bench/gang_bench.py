"""Local gang under faults: how fast each failure is noticed and how clean the cleanup is.

For each repeat, a 2-node gang (tiny GPT, gloo over loopback) is started and, once training,
one of these is done to it:

- kill:   SIGKILL node 1's agent (supervisor + torchrun; its worker is orphaned) → seconds until
          ``poll`` reports the node vanished, cleanup seconds, processes left after cleanup;
- stall:  SIGSTOP rank 1's trainer → seconds until ``Watch`` reports stalled, against
          ``stall_timeout_s``; processes left after cleanup;
- cancel: what failing/clearing the task does (``cleanup``: SIGTERM, grace, SIGKILL) → seconds to
          exit, trainer state, checkpoint at the last step, processes SIGKILLed, processes left.

Watchers poll every 0.2 s (the DAG's trigger polls every 2 s, so add up to 2 s there).

    .venv/bin/python bench/gang_bench.py [--repeats 3] [--stall-timeout 5]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def setup(root: Path):
    os.environ["TAXIWAY_HOME"] = str(root / "home")
    from pipelines import manifest, tokenize
    from pipelines.config import load_config

    for split, n in (("train", 60), ("val", 10)):
        (root / split).mkdir(parents=True)
        for i in range(n):
            (root / split / f"{i}.txt").write_text(f"doc {i} in {split}: " + "lorem ipsum dolor sit amet " * (i % 7 + 2))
    manifest.write(root / "manifest.jsonl", manifest.scan(root))
    cfg = load_config(REPO / "configs" / "tiny.yaml", [
        f"data.train={root / 'train'}", f"data.val={root / 'val'}", f"data.manifest={root / 'manifest.jsonl'}",
        "tokenizer.vocab_size=280", "train.steps=1000000", "checkpoint.every_steps=5"])
    return cfg, tokenize.pack_splits(cfg).path


def launch(cfg, packed: Path, run_dir: Path):
    from pipelines.launch import local
    from pipelines.launch.spec import launch_spec, write_trainer_spec

    write_trainer_spec(cfg, run_dir, packed)
    handle = local.submit(launch_spec(cfg, run_dir))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            s = json.loads((run_dir / "status.json").read_text())
            if s["state"] == "running" and s["step"] >= 3:
                return handle
        except (FileNotFoundError, json.JSONDecodeError):
            pass
        time.sleep(0.1)
    raise RuntimeError("gang did not start")


def kill_case(cfg, packed: Path, run_dir: Path) -> dict:
    from pipelines.launch import local

    handle = launch(cfg, packed, run_dir)
    os.killpg(handle.nodes[1].pid, signal.SIGKILL)
    t0 = time.monotonic()
    while local.poll(handle).state == local.RUNNING:
        time.sleep(0.2)
    detected = time.monotonic() - t0
    t1 = time.monotonic()
    killed = local.cleanup(handle, grace_s=cfg.compute.cancel_grace_s)
    return {"detect_s": detected, "cleanup_s": time.monotonic() - t1, "sigkilled": killed,
            "left": len(local.processes(handle.gang_id))}


def stall_case(cfg, packed: Path, run_dir: Path, stall_timeout: float) -> dict:
    from pipelines.launch import local
    from pipelines.launch.watch import Watch

    handle = launch(cfg, packed, run_dir)
    watch = Watch(str(handle.path), handle.gang_id, stall_timeout, 600, time.time() + 3600)
    watch.check()
    for pid in local.processes(handle.gang_id, rank=1):
        os.kill(pid, signal.SIGSTOP)
    t0 = time.monotonic()
    while (r := watch.check())["state"] == local.RUNNING:
        time.sleep(0.2)
    detected = time.monotonic() - t0
    killed = local.cleanup(handle, grace_s=5)
    return {"detect_s": detected, "state": r["state"], "sigkilled": killed,
            "left": len(local.processes(handle.gang_id))}


def cancel_case(cfg, packed: Path, run_dir: Path) -> dict:
    from pipelines.launch import local
    from trainer import checkpoint

    handle = launch(cfg, packed, run_dir)
    t0 = time.monotonic()
    killed = local.cleanup(handle, grace_s=cfg.compute.cancel_grace_s)
    seconds = time.monotonic() - t0
    status = json.loads((run_dir / "status.json").read_text())
    newest = checkpoint.latest_valid(run_dir / "checkpoints")
    return {"exit_s": seconds, "state": status["state"], "sigkilled": killed,
            "checkpoint_at_last_step": newest is not None and newest.name == f"step-{status['step']:08d}",
            "left": len(local.processes(handle.gang_id))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--stall-timeout", type=float, default=5.0)
    args = ap.parse_args()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with tempfile.TemporaryDirectory() as tmp:
        cfg, packed = setup(Path(tmp))
        runs: dict[str, list[dict]] = {"kill": [], "stall": [], "cancel": []}
        for i in range(args.repeats):
            runs["kill"].append(kill_case(cfg, packed, Path(tmp) / f"kill{i}"))
            runs["stall"].append(stall_case(cfg, packed, Path(tmp) / f"stall{i}", args.stall_timeout))
            runs["cancel"].append(cancel_case(cfg, packed, Path(tmp) / f"cancel{i}"))
            print(json.dumps({k: v[-1] for k, v in runs.items()}), flush=True)
    summary = {"date": started, "cpus": os.cpu_count(), "repeats": args.repeats,
               "stall_timeout_s": args.stall_timeout,
               "kill_detect_s_median": round(statistics.median(r["detect_s"] for r in runs["kill"]), 2),
               "kill_cleanup_s_median": round(statistics.median(r["cleanup_s"] for r in runs["kill"]), 2),
               "stall_detect_s_median": round(statistics.median(r["detect_s"] for r in runs["stall"]), 2),
               "stall_detect_s_max": round(max(r["detect_s"] for r in runs["stall"]), 2),
               "cancel_exit_s_median": round(statistics.median(r["exit_s"] for r in runs["cancel"]), 2),
               "cancel_states": sorted({r["state"] for r in runs["cancel"]}),
               "cancel_checkpoint_at_last_step": all(r["checkpoint_at_last_step"] for r in runs["cancel"]),
               "cancel_sigkilled_total": sum(r["sigkilled"] for r in runs["cancel"]),
               "processes_left_total": sum(r["left"] for rs in runs.values() for r in rs)}
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
