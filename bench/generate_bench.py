"""Generation with the KV cache vs without (the whole window recomputed every step), 256 new greedy
tokens, one thread, on Taxiway's GPT and Llama: seconds (median of ``--repeats``, the two methods
alternated), the speed-up, and whether the tokens are the same (they must be). Random weights: speed
does not depend on what the model learned, and a greedy sequence of a random model still tests equality.

    .venv/bin/python bench/generate_bench.py --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import harness

sys.path.insert(0, str(harness.REPO))


def models():
    from trainer.llama import Llama, LlamaConfig
    from trainer.model import GPT, GPTConfig

    return {"gpt 6x384": GPT(GPTConfig(vocab_size=8192, n_layer=6, n_head=6, n_embd=384, block_size=512)),
            "llama 6x384 gqa": Llama(LlamaConfig(vocab_size=8192, n_layer=6, n_head=6, n_kv_head=2, n_embd=384,
                                                 intermediate_size=1024, block_size=512))}


def main() -> None:
    import torch

    from eval.generate import sample

    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--out", type=Path, default=harness.REPO / "bench" / "results")
    args = ap.parse_args()
    torch.set_num_threads(1)
    started = harness.start()
    torch.manual_seed(0)
    prompt = list(range(1, 17))
    figures = {}
    for name, model in models().items():
        times: dict[bool, list[float]] = {True: [], False: []}
        outs: dict[bool, list[int]] = {}
        for _ in range(args.repeats):
            for cache in (False, True):
                t0 = time.perf_counter()
                outs[cache] = sample(model, prompt, args.tokens, 0.0, None, 0, None, "cpu", cache=cache)
                times[cache].append(time.perf_counter() - t0)
        cached, whole = statistics.median(times[True]), statistics.median(times[False])
        figures[name] = {"cached_s": round(cached, 3), "uncached_s": round(whole, 3),
                         "speedup": round(whole / cached, 2), "same_tokens": outs[True] == outs[False],
                         "tokens": len(outs[True]), "runs_cached_s": [round(t, 3) for t in times[True]],
                         "runs_uncached_s": [round(t, 3) for t in times[False]]}
    table = harness.markdown(["model", "with cache (s)", "without (s)", "speed-up", "same greedy tokens"],
                             [[n, f["cached_s"], f["uncached_s"], f"{f['speedup']}x", f["same_tokens"]]
                              for n, f in figures.items()])
    path = harness.write("generate", f".venv/bin/python bench/generate_bench.py --repeats {args.repeats} "
                         f"--tokens {args.tokens}", "1 thread, CPU, random weights, prompt of 16 tokens, greedy",
                         figures, table, args.out, started)
    print(table)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
