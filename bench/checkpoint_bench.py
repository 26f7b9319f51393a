"""Sharded checkpoints: memory per rank during a save, and training blocked per save, async / sync.

Each measurement is a fresh ``torchrun --standalone --nproc-per-node 2`` (gloo, CPU) of this script,
FSDP2 over the trainer benchmark's ~30M-parameter Llama after one AdamW step (so the optimizer state
exists), every rank sampling its own RSS every 2 ms from a thread. glibc is told to map every block
over 64 KiB on its own (``MALLOC_MMAP_THRESHOLD_``) and the heap is trimmed before the baseline, so
memory freed earlier (the backward pass's) cannot hide a new allocation from RSS:

- ``sharded`` (the trainer's path): ``trainer.saver.Saver`` on every rank — stage this rank's part
  into DCP's reusable buffers, write it with ``torch.distributed.checkpoint`` in the background,
  rank 0 commits. Peak RSS above the rank's RSS before the first save, over the rank's own shard
  (bytes of its part of the model and optimizer state). Then the loop's blocked seconds per save
  (``save`` until it returns; ``--steps-between`` training steps between saves, as a run trains
  between checkpoints), async and sync, alternating. Last, the weights-only export
  (``shards.write_weights``: every rank writes its part, rank 0 consolidates them into one
  safetensors file tensor by tensor): peak RSS growth over the rank's share of the weights.
- ``gathered`` (the previous format, the way to save a full state that the PyTorch docs give for
  FSDP2): ``get_model_state_dict``/``get_optimizer_state_dict`` with ``full_state_dict=True,
  cpu_offload=True``, then rank 0 ``torch.save``s it. The same peak-over-shard figure, rank 0's; and
  its export: the full model gathered to rank 0 and ``safetensors.save_file``d.

    .venv/bin/python bench/checkpoint_bench.py [--saves 8] [--steps-between 10]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
OUT = REPO / "bench" / "results" / "checkpoint.json"


class PeakRss:
    """This process's RSS, sampled every 2 ms from a thread, above a baseline."""

    def __init__(self) -> None:
        self.proc, self.base, self.peak, self._stop = psutil.Process(), 0, 0, threading.Event()

    def __enter__(self) -> PeakRss:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        self.base = self.peak = self.proc.memory_info().rss
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, self.proc.memory_info().rss)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)

    @property
    def grown(self) -> int:
        return self.peak - self.base


def child(method: str, saves: int, between: int, root: Path) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from trainer_bench import BIG, shaped

    from trainer import arch, shards
    from trainer.saver import Saver, local_bytes

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    cfg = arch.config_from_dict(shaped(BIG, "llama"), "bench")
    model = arch.build(cfg)
    for block in arch.layers(model):
        fully_shard(block)
    fully_shard(model)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, cfg.vocab_size, (1, 64))

    def step() -> None:
        model(x, x)[1].backward()
        optim.step()
        optim.zero_grad(set_to_none=True)

    step()
    shard = local_bytes(shards.state_of(model, optim))[0]
    out: dict = {"rank": rank, "shard_bytes": shard, "weight_shard_bytes": local_bytes(shards.state_of(model, optim)["model"])[0]}
    if method == "sharded":
        saver = Saver(root, keep_last_n=2, async_save=False, device=torch.device("cpu"), rank=rank, world=world)
        with PeakRss() as rss:
            saver.reserve(shards.state_of(model, optim))
            saver.save(1, shards.state_of(model, optim), {"format": 3})
        out["peak_grown_bytes"] = rss.grown
        blocked: dict[str, list[float]] = {"async": [], "sync": []}
        for i in range(2, 2 + 2 * saves):
            mode = ("async", "sync")[(i + i // 2) % 2]  # A B B A ...
            saver.async_save = mode == "async"
            for _ in range(between):
                step()
            started = time.perf_counter()
            saver.save(i, shards.state_of(model, optim), {"format": 3})
            blocked[mode].append(time.perf_counter() - started)
        saver.wait()
        saver.close()
        out["blocked_s"] = blocked
        with PeakRss() as rss:
            (root / "export").mkdir(exist_ok=True)
            shards.write_weights(model, root / "export")
        out["export_peak_grown_bytes"] = rss.grown
    else:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        with PeakRss() as rss:
            options = StateDictOptions(full_state_dict=True, cpu_offload=True)
            model_state, optim_state = get_state_dict(model, optim, options=options)
            if rank == 0:
                torch.save({"model": model_state, "optim": optim_state}, root / "full.pt")
            del model_state, optim_state
            dist.barrier()
        out["peak_grown_bytes"] = rss.grown
        from safetensors.torch import save_file
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        with PeakRss() as rss:
            weights = get_model_state_dict(model, options=options)
            if rank == 0:
                save_file({k: v for k, v in weights.items() if k != "lm_head.weight"}, str(root / "model.safetensors"))
            del weights
            dist.barrier()
        out["export_peak_grown_bytes"] = rss.grown
    dist.destroy_process_group()
    (root / f"rank{rank}.json").write_text(json.dumps(out))


def run(method: str, saves: int, between: int) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix=f"ckpt-{method}-") as tmp:
        proc = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
             str(Path(__file__).resolve()), "--child", method, "--saves", str(saves), "--steps-between", str(between), "--root", tmp],
            capture_output=True, text=True, cwd=REPO,
            env={**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": str(64 << 10)})
        if proc.returncode:
            sys.exit(f"{method} failed:\n{proc.stderr[-4000:]}")
        return [json.loads((Path(tmp) / f"rank{rank}.json").read_text()) for rank in range(2)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child")
    parser.add_argument("--root", type=Path)
    parser.add_argument("--saves", type=int, default=8, help="saves per mode (async, sync) in the blocking run")
    parser.add_argument("--steps-between", type=int, default=10, help="training steps between two saves")
    args = parser.parse_args()
    if args.child:
        child(args.child, args.saves, args.steps_between, args.root)
        return
    sharded, gathered = run("sharded", args.saves, args.steps_between), run("gathered", args.saves, args.steps_between)
    med = statistics.median
    async_s = med(s for r in sharded for s in r["blocked_s"]["async"])
    sync_s = med(s for r in sharded for s in r["blocked_s"]["sync"])
    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"), "machine": f"{os.cpu_count()} cores",
        "command": "python bench/checkpoint_bench.py " + " ".join(sys.argv[1:]),
        "model": "trainer_bench BIG as Llama, FSDP2 over 2 ranks (gloo, CPU)",
        "sharded": sharded, "gathered": gathered,
        "sharded_peak_over_shard": [round(r["peak_grown_bytes"] / r["shard_bytes"], 3) for r in sharded],
        "gathered_peak_over_shard_rank0": round(gathered[0]["peak_grown_bytes"] / gathered[0]["shard_bytes"], 3),
        "export_peak_over_weight_shard": [round(r["export_peak_grown_bytes"] / r["weight_shard_bytes"], 3) for r in sharded],
        "gathered_export_peak_over_weight_shard_rank0":
            round(gathered[0]["export_peak_grown_bytes"] / gathered[0]["weight_shard_bytes"], 3),
        "async_blocked_s_per_save": round(async_s, 5), "sync_blocked_s_per_save": round(sync_s, 5),
        "blocked_ratio": round(async_s / sync_s, 3),
    }
    OUT.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("sharded", "gathered")}, indent=1))


if __name__ == "__main__":
    main()
