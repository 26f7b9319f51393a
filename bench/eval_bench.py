"""Evaluation throughput, side by side with a bare ``torch.no_grad()`` loop over the same batches.

- bare: the val windows already in memory as tensors (x, y, document ids), then only
  ``model(x, y, doc_ids, reduction="none")`` per batch under ``torch.no_grad()`` — the floor any
  evaluation pays;
- taxiway: ``eval.score.score`` end to end — reads the packed shards, builds each batch and its
  per-token document numbers (on a prefetch thread), runs the same model on the same batches,
  and keeps per-sequence and per-document bits and bytes.

Same model (the demo config's GPT, seeded), same windows, same batch size, same torch threads.
Each measurement in its own fresh process, timed after imports and after one warm-up batch;
medians over repeats, the two methods alternating.

    .venv/bin/python bench/eval_bench.py [--repeats 5] [--windows 1024] [--threads N] [--config configs/demo.yaml]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
METHODS = ("bare", "taxiway")


def build(home: Path, config: Path) -> Path:
    """The demo corpus packed as the config says; returns the packed folder."""
    from pipelines import tokenize
    from pipelines.config import load_config
    from pipelines.demo_data import write_demo_data

    write_demo_data(home / "demo-data", seed=0)
    return tokenize.pack_splits(load_config(config)).path


def _model(config: Path, packed: Path):
    import torch

    from pipelines.config import load_config
    from trainer.model import GPT, GPTConfig

    m = load_config(config).model
    vocab = json.loads((packed / "manifest.json").read_text())["vocab_size"]
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=vocab, n_layer=m.n_layer, n_head=m.n_head, n_embd=m.n_embd,
                         block_size=m.block_size)).eval()


def worker(method: str, config: Path, packed: Path, windows: int, batch: int, threads: int | None) -> dict:
    import numpy as np
    import torch

    if threads:
        torch.set_num_threads(threads)
    from eval.score import score
    from trainer.data import PackedSplit

    model = _model(config, packed)
    data = PackedSplit(packed, "val")
    n = min(windows, len(data)) // batch * batch
    if method == "bare":
        batches = [tuple(torch.from_numpy(a) for a in data.batch(np.arange(lo, lo + batch)))
                   for lo in range(0, n, batch)]
        with torch.no_grad():
            model(*batches[0], reduction="none")  # warm-up
            started, cpu = time.perf_counter(), time.process_time()
            for x, y, d in batches:
                model(x, y, d, reduction="none")
            seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    else:
        score(model, packed, "val", batch, 1)  # warm-up
        started, cpu = time.perf_counter(), time.process_time()
        result = score(model, packed, "val", batch, n // batch)
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
        assert result.sequences == n
    return {"method": method, "windows": n, "tokens": n * data.seq_len, "seconds": seconds,
            "cpu_seconds": cpu, "threads": torch.get_num_threads()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--windows", type=int, default=1024)
    ap.add_argument("--config", type=Path, default=REPO / "configs" / "demo.yaml")
    ap.add_argument("--threads", type=int, default=None, help="torch threads in both methods (default: torch's)")
    ap.add_argument("--worker", choices=METHODS)
    ap.add_argument("--packed", type=Path)
    args = ap.parse_args()

    from pipelines.config import load_config

    batch = load_config(args.config).eval.batch_size
    if args.worker:
        print(json.dumps(worker(args.worker, args.config, args.packed, args.windows, batch, args.threads)))
        return

    started = datetime.now(UTC).isoformat(timespec="seconds")
    home = Path(tempfile.mkdtemp(prefix="eval-bench-"))
    env = {**os.environ, "TAXIWAY_HOME": str(home)}
    os.environ["TAXIWAY_HOME"] = str(home)
    packed = build(home, args.config)
    runs: dict[str, list[dict]] = {m: [] for m in METHODS}
    for r in range(args.repeats):
        for method in METHODS if r % 2 == 0 else METHODS[::-1]:
            out = subprocess.run([sys.executable, __file__, "--worker", method, "--packed", str(packed),
                                  "--windows", str(args.windows), "--config", str(args.config),
                                  *(["--threads", str(args.threads)] if args.threads else [])],
                                 capture_output=True, text=True, env=env, check=True)
            runs[method].append(json.loads(out.stdout.strip().splitlines()[-1]))
    rate = {m: statistics.median(r["tokens"] / r["seconds"] for r in runs[m]) for m in METHODS}
    ratio = rate["taxiway"] / rate["bare"]
    # each repeat ran the two back to back: their ratio is robust to load that drifts between repeats
    pairs = [b["seconds"] / t["seconds"] for b, t in zip(runs["bare"], runs["taxiway"], strict=True)]
    paired = statistics.median(pairs)
    first = runs["bare"][0]
    print(f"started {started}; {platform.node()}, {os.cpu_count()} cores, torch threads {first['threads']}; "
          f"config {args.config.name}, batch {batch}, {first['windows']} windows ({first['tokens']} tokens)")
    cpu = {m: statistics.median(r["cpu_seconds"] * 1e6 / r["tokens"] for r in runs[m]) for m in METHODS}
    print("| method | tokens/s (median) | CPU ms per 1k tokens (median) | all repeats (tokens/s) |")
    print("|---|---|---|---|")
    for m in METHODS:
        every = ", ".join(f"{r['tokens'] / r['seconds']:,.0f}" for r in runs[m])
        print(f"| {m} | {rate[m]:,.0f} | {cpu[m]:.1f} | {every} |")
    print(f"taxiway / bare, ratio of medians = {ratio:.3f}; median of per-repeat ratios = {paired:.3f} "
          f"({', '.join(f'{p:.3f}' for p in pairs)}); target >= 0.90: {'met' if min(ratio, paired) >= 0.9 else 'NOT met'}")
    print(f"CPU time per token, taxiway / bare = {cpu['taxiway'] / cpu['bare']:.3f} (the work added by reading, "
          "document numbering and tallies; less sensitive than wall time to other processes on the machine)")
    results = REPO / "bench" / "results"
    results.mkdir(parents=True, exist_ok=True)
    (results / "eval.json").write_text(json.dumps({"started": started, "runs": runs, "median_tokens_per_s": rate,
                                                   "ratio_of_medians": ratio, "per_repeat_ratios": pairs,
                                                   "median_cpu_ms_per_1k_tokens": cpu}, indent=2))


if __name__ == "__main__":
    main()
