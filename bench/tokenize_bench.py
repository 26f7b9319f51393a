"""Tokenize-and-pack benchmark, side by side, same texts, same tokenizer (8k byte-level BPE
trained on the demo corpus's train split):

- raw: ``Tokenizer.encode_batch`` over the texts already in memory (batches of 512), all cores;
- taxiway: ``pipelines.tokenize.run`` end to end (read files, tokenize, pack windows, write shards),
  cold cache, then warm (cache hit); it encodes with ``pipelines.tokenize.engine`` (tiktoken, which
  gives this tokenizer's ids exactly — tested — so every method produces the same ids);
- megatron-style: ``multiprocessing.Pool(cores)`` calling ``tokenizer.encode`` per document and
  writing the ids to a binary file;
- datasets: HF ``Dataset.map(batched=True, num_proc=cores)`` calling ``encode_batch``, ids written out.

Corpora: the demo corpus (1x) and 10 copies of it under other names (10x). Each measurement in
its own fresh process, timed after imports; peak RSS = the process's VmHWM.

    .venv/bin/python bench/tokenize_bench.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from multiprocessing import Pool
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
VOCAB = 8192


def build(base: Path) -> dict[str, Path]:
    from pipelines import manifest
    from pipelines.config import load_config
    from pipelines.demo_data import write_demo_data
    from pipelines.tokenize import bpe

    one = base / "x1"
    write_demo_data(one, seed=0)
    ten = base / "x10"
    for split in ("train", "val"):
        (ten / split).mkdir(parents=True)
        for copy in range(10):
            for f in (one / split).iterdir():
                shutil.copyfile(f, ten / split / f"c{copy}-{f.name}")
    manifest.write(ten / "manifest.jsonl", manifest.scan(ten))
    cfg = load_config(REPO / "configs" / "tiny.yaml", [f"tokenizer.vocab_size={VOCAB}"])
    texts = (p.read_text() for p in sorted((one / "train").iterdir()))
    bpe.train(texts, cfg.tokenizer).save(str(base / "tokenizer.json"))
    return {"x1": one, "x10": ten}


def _files(data: Path) -> list[Path]:
    return sorted((data / "train").iterdir()) + sorted((data / "val").iterdir())


def _peak_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def run_raw(data: Path, tok_path: Path) -> dict:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tok_path))
    texts = [p.read_text() for p in _files(data)]
    t = time.perf_counter()
    tokens = sum(len(e.ids) for i in range(0, len(texts), 512) for e in tok.encode_batch(texts[i:i + 512]))
    return {"seconds": time.perf_counter() - t, "tokens": tokens}


def run_taxiway(data: Path, tok_path: Path, home: Path) -> dict:
    os.environ["TAXIWAY_HOME"] = str(home)
    from pipelines import tokenize
    from pipelines.config import load_config

    cfg = load_config(REPO / "configs" / "tiny.yaml", [
        f"data.train={data / 'train'}", f"data.val={data / 'val'}", f"data.manifest={data / 'manifest.jsonl'}",
        f"tokenizer.path={tok_path}", "pack.seq_len=1024", "model.block_size=1024"])
    t = time.perf_counter()
    cold = tokenize.run(cfg)
    cold_s = time.perf_counter() - t
    t = time.perf_counter()
    warm = tokenize.run(cfg)
    warm_s = time.perf_counter() - t
    assert not cold.cache_hit and warm.cache_hit
    m = cold.manifest()
    tokens = sum(s["tokens"] for s in m["splits"].values()) - sum(s["documents"] for s in m["splits"].values())
    return {"seconds": cold_s, "warm_seconds": warm_s, "tokens": tokens}


_TOK = None


def _init(path: str) -> None:
    global _TOK
    from tokenizers import Tokenizer

    _TOK = Tokenizer.from_file(path)


def _encode_file(path: str) -> list[int]:
    return _TOK.encode(Path(path).read_text()).ids


def run_megatron(data: Path, tok_path: Path, out: Path) -> dict:
    import numpy as np

    t = time.perf_counter()
    tokens = 0
    with Pool(os.cpu_count(), initializer=_init, initargs=(str(tok_path),)) as pool, open(out, "wb") as fh:
        for ids in pool.imap(_encode_file, [str(p) for p in _files(data)], chunksize=16):
            np.asarray(ids, dtype=np.uint16).tofile(fh)
            tokens += len(ids)
    return {"seconds": time.perf_counter() - t, "tokens": tokens}


def _encode_paths(batch: dict, tok_path: str) -> dict:
    if _TOK is None:
        _init(tok_path)
    texts = [Path(p).read_text() for p in batch["path"]]
    return {"ids": [e.ids for e in _TOK.encode_batch(texts)]}


def run_datasets(data: Path, tok_path: Path, scratch: Path) -> dict:
    """HF ``datasets``: ``Dataset.map(batched=True, num_proc=cores)``, then the ids written out."""
    import datasets
    import numpy as np

    datasets.disable_progress_bars()
    t = time.perf_counter()
    ds = datasets.Dataset.from_dict({"path": [str(p) for p in _files(data)]})
    out = ds.map(_encode_paths, fn_kwargs={"tok_path": str(tok_path)}, batched=True, batch_size=64,
                 num_proc=os.cpu_count(), remove_columns=["path"], load_from_cache_file=False,
                 cache_file_name=str(scratch / "map.arrow"))
    tokens = 0
    with open(scratch / "ids.bin", "wb") as fh:
        for batch in out.iter(batch_size=256):
            for ids in batch["ids"]:
                np.asarray(ids, dtype=np.uint16).tofile(fh)
                tokens += len(ids)
    return {"seconds": time.perf_counter() - t, "tokens": tokens}


def child(method: str, data: str, tok: str, scratch: str) -> None:
    data_p, tok_p, scratch_p = Path(data), Path(tok), Path(scratch)
    out = {"raw": lambda: run_raw(data_p, tok_p),
           "taxiway": lambda: run_taxiway(data_p, tok_p, scratch_p),
           "megatron": lambda: run_megatron(data_p, tok_p, scratch_p / "ids.bin"),
           "datasets": lambda: run_datasets(data_p, tok_p, scratch_p)}[method]()
    out["peak_rss_mib"] = _peak_mib()
    print(json.dumps(out))


def measure(method: str, data: Path, tok: Path) -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        proc = subprocess.run([sys.executable, __file__, "--child", method, str(data), str(tok), scratch],
                              capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--child", nargs=4)
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return
    results = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpus": os.cpu_count(), "vocab": VOCAB}
    with tempfile.TemporaryDirectory() as tmp:
        corpora = build(Path(tmp))
        tok = Path(tmp) / "tokenizer.json"
        for name, data in corpora.items():
            row = {}
            for method in ("raw", "taxiway", "megatron", "datasets"):
                runs = [measure(method, data, tok) for _ in range(args.repeats)]
                sec = statistics.median(r["seconds"] for r in runs)
                row[method] = {"median_s": round(sec, 3), "tokens": runs[0]["tokens"],
                               "tokens_per_s": round(runs[0]["tokens"] / sec),
                               "peak_rss_mib": round(max(r["peak_rss_mib"] for r in runs), 1)}
                if method == "taxiway":
                    row[method]["warm_median_s"] = round(statistics.median(r["warm_seconds"] for r in runs), 3)
            row["taxiway_vs_raw"] = round(row["taxiway"]["tokens_per_s"] / row["raw"]["tokens_per_s"], 3)
            row["taxiway_vs_megatron"] = round(row["taxiway"]["tokens_per_s"] / row["megatron"]["tokens_per_s"], 2)
            row["taxiway_vs_datasets"] = round(row["taxiway"]["tokens_per_s"] / row["datasets"]["tokens_per_s"], 2)
            results[name] = row
            print(json.dumps({name: row}, indent=2), flush=True)
        results["taxiway_peak_rss_x10_over_x1"] = round(
            results["x10"]["taxiway"]["peak_rss_mib"] / results["x1"]["taxiway"]["peak_rss_mib"], 2)
    print(json.dumps({"taxiway_peak_rss_x10_over_x1": results["taxiway_peak_rss_x10_over_x1"]}))


if __name__ == "__main__":
    main()
