"""Tokenize-and-pack against its true ceiling: the engine it runs, on the same texts in memory.

Same texts, same tokenizer (8192-token byte-level BPE trained on the demo train split):

- tiktoken: raw ``Encoding.encode_ordinary_batch`` over the texts already in memory, built from
  the tokenizer exactly as the stage builds it (``engine.tiktoken_encoding``) — the stage's own
  engine, so the ceiling of the stage (target: stage >= 0.85x its speed);
- tiktoken_numpy: the stage's encoder (``engine.batch_encoder``): ``encode_to_numpy`` per document
  (ids as one uint32 buffer each, no Python ints) on a pool of the process's cores, one ``Encoding``
  per thread, over the same texts in memory;
- hf_fast: HF ``Tokenizer.encode_batch_fast`` (no offsets) over the same texts in memory;
- taxiway: ``pipelines.tokenize.pack_splits`` end to end (manifest, read files, encode, pack windows,
  write shards and the token cache), cold cache, then warm (cache hit).

Every method runs on one core (pinned) and on all cores, each measurement in a fresh process,
timed after imports and after reading the texts; medians of ``--repeats`` (``--slow-repeats`` for
hf_fast, about 5x slower than the ceiling, to keep the whole run near 5 minutes). Every method's ids
are checked equal: per split, the sha256 of the stream the stage packs (ids, EOS after each
document, cut to whole ``seq_len + 1`` windows). Corpora: the demo corpus (1x) and ten copies
under other names (10x).

    .venv/bin/python bench/tokenize_bench.py [--repeats 3] [--corpora x1,x10] [--out bench/results]

writes ``tokenize.json`` (raw figures) and ``tokenize.md`` (the table) in ``--out``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

REPO = harness.REPO
VOCAB, SEQ_LEN, EOS = 8192, 1024, "<|endoftext|>"
METHODS = ("tiktoken", "tiktoken_numpy", "hf_fast", "taxiway")
SPLITS = ("train", "val")
SLOW = {"hf_fast"}


def build(base: Path) -> dict[str, Path]:
    sys.path.insert(0, str(REPO))
    from pipelines import manifest
    from pipelines.config import TokenizerConfig
    from pipelines.demo_data import write_demo_data
    from pipelines.tokenize import bpe

    one = base / "x1"
    write_demo_data(one, seed=0)
    ten = base / "x10"
    for split in SPLITS:
        (ten / split).mkdir(parents=True)
        for copy in range(10):
            for f in (one / split).iterdir():
                shutil.copyfile(f, ten / split / f"c{copy}-{f.name}")
    manifest.write(ten / "manifest.jsonl", manifest.scan(ten))
    texts = (p.read_text() for p in sorted((one / "train").iterdir()))
    bpe.train(texts, TokenizerConfig(vocab_size=VOCAB, eos_token=EOS)).save(str(base / "tokenizer.json"))
    return {"x1": one, "x10": ten}


def _texts(data: Path) -> dict[str, list[str]]:
    """Per split, the documents in the order the stage packs them (by manifest path)."""
    return {split: [p.read_text() for p in sorted((data / split).iterdir())] for split in SPLITS}


def _digest(ids: list, eos: int) -> tuple[str, int]:
    """sha256 of the packed stream of these documents (EOS after each, whole windows only) and its tokens."""
    import numpy as np

    sep = np.array([eos], np.uint32)
    stream = np.concatenate([piece for doc in ids for piece in (np.asarray(doc, np.uint32), sep)])
    stream = stream[:len(stream) // (SEQ_LEN + 1) * (SEQ_LEN + 1)]
    return hashlib.sha256(stream.tobytes()).hexdigest(), sum(map(len, ids))


def run_engine(method: str, data: Path, tok_path: Path) -> dict:
    from pipelines.tokenize import bpe, engine

    tok = bpe.load(tok_path, EOS)
    eos = tok.token_to_id(EOS)
    texts = _texts(data)
    spec = json.loads(tok_path.read_text())
    if method == "tiktoken":
        enc, threads = engine.tiktoken_encoding(spec), engine.cores()

        def encode(batch: list[str]) -> list[list[int]]:
            return enc.encode_ordinary_batch(batch, num_threads=threads)
    elif method == "tiktoken_numpy":  # the stage's own encoder: batch_encoder picks tiktoken for this tokenizer
        encoder = engine.batch_encoder(tok, tok_path)
        assert encoder.__name__ == "tiktoken_bpe", encoder.__name__
        encode = encoder.arrays
    else:
        def encode(batch: list[str]) -> list[list[int]]:
            return [e.ids for e in tok.encode_batch_fast(batch, add_special_tokens=False)]
    t = time.perf_counter()
    ids = {split: encode(texts[split]) for split in SPLITS}
    seconds, peak = time.perf_counter() - t, harness.peak_mib()  # before the checksums below
    digests = {split: _digest(ids[split], eos) for split in SPLITS}
    return {"seconds": seconds, "peak_rss_mib": peak, "tokens": sum(n for _, n in digests.values()),
            "sha256": {split: d for split, (d, _) in digests.items()}}


def run_taxiway(data: Path, tok_path: Path, home: Path) -> dict:
    os.environ["TAXIWAY_HOME"] = str(home)
    import numpy as np

    from pipelines import tokenize
    from pipelines.config import load_config
    from pipelines.heap import set_policy

    set_policy()  # as the process running the stage does (taxiway's main, a task's start)
    cfg = load_config(REPO / "configs" / "tiny.yaml", [
        f"data.train={data / 'train'}", f"data.val={data / 'val'}", f"data.manifest={data / 'manifest.jsonl'}",
        f"tokenizer.path={tok_path}", f"pack.seq_len={SEQ_LEN}", f"model.block_size={SEQ_LEN}"])
    t = time.perf_counter()
    cold = tokenize.pack_splits(cfg)
    cold_s = time.perf_counter() - t
    t = time.perf_counter()
    warm = tokenize.pack_splits(cfg)
    warm_s = time.perf_counter() - t
    assert not cold.cache_hit and warm.cache_hit
    peak = harness.peak_mib()  # before the checksums below
    m = cold.manifest()
    sha = {}
    for split in SPLITS:
        digest = hashlib.sha256()
        for shard in m["splits"][split]["shards"]:
            digest.update(np.load(cold.path / shard["path"]).astype(np.uint32).tobytes())
        sha[split] = digest.hexdigest()
    tokens = sum(s["tokens"] - s["documents"] for s in m["splits"].values())
    return {"seconds": cold_s, "warm_seconds": warm_s, "peak_rss_mib": peak, "tokens": tokens, "sha256": sha,
            "encoder": m["stats"]["encoder"]}


def child(method: str, data: str, tok: str, cores: str) -> None:
    harness.pin(cores)
    sys.path.insert(0, str(REPO))
    with tempfile.TemporaryDirectory() as scratch:
        if method == "taxiway":
            out = run_taxiway(Path(data), Path(tok), Path(scratch))
        else:
            out = run_engine(method, Path(data), Path(tok))
    out.setdefault("peak_rss_mib", harness.peak_mib())
    print(json.dumps(out))


def table(figures: dict) -> str:
    rows = []
    for name, row in figures["corpora"].items():
        for cores, by in row["cores"].items():
            for method in METHODS:
                m = by[method]
                rows.append([name, cores, method, m["median_s"], f"{m['tokens_per_s'] / 1e6:.2f} M",
                             m["peak_rss_mib"], m.get("warm_median_s", ""),
                             by["ratios"].get(f"{method}_vs_tiktoken", "")])
    header = ["corpus", "cores", "method", "median s", "tokens/s", "peak RSS MiB", "warm s", "speed vs tiktoken"]
    same = "yes" if figures["same_ids_all_methods"] else "**NO**"
    return (harness.markdown(header, rows)
            + f"\nSame ids (sha256 of each split's packed stream) across all methods and core counts: {same}.\n")


def main() -> None:
    args = harness.arguments(("METHOD", "DATA", "TOKENIZER"), "hf_fast (5x slower than the ceiling)")
    if args.child:
        child(*args.child, args.cores)
        return
    started = harness.start()
    figures: dict = {"vocab": VOCAB, "seq_len": SEQ_LEN, "repeats": args.repeats, "slow_repeats": args.slow_repeats,
                     "corpora": {}}
    digests = set()
    with tempfile.TemporaryDirectory() as tmp:
        corpora = build(Path(tmp))
        tok = Path(tmp) / "tokenizer.json"
        for name in args.corpora.split(","):
            data = corpora[name]
            row: dict = {"mb": round(sum(p.stat().st_size for s in SPLITS for p in (data / s).iterdir()) / 1e6, 2),
                         "cores": {}}
            for cores in (harness.ONE, harness.ALL):
                by: dict = {}
                for method in METHODS:
                    repeats = args.slow_repeats if method in SLOW else args.repeats
                    runs = [harness.measure(__file__, [method, str(data), str(tok)], cores) for _ in range(repeats)]
                    by[method] = {**harness.summary(runs), "tokens": runs[0]["tokens"], "sha256": runs[0]["sha256"]}
                    by[method]["tokens_per_s"] = round(runs[0]["tokens"] / by[method]["median_s"])
                    if method == "taxiway":
                        by[method]["warm_median_s"] = harness.summary(runs, "warm_seconds")["median_s"]
                        by[method]["encoder"] = runs[0]["encoder"]
                    digests |= {(name, json.dumps(r["sha256"], sort_keys=True), r["tokens"]) for r in runs}
                t = by["tiktoken"]["median_s"]
                by["ratios"] = {f"{m}_vs_tiktoken": round(t / by[m]["median_s"], 3) for m in METHODS if m != "tiktoken"}
                row["cores"][cores] = by
                print(json.dumps({name: {cores: {m: by[m]["median_s"] for m in METHODS}, "ratios": by["ratios"]}}),
                      flush=True)
            figures["corpora"][name] = row
    figures["same_ids_all_methods"] = len({(n, d) for n, d, _ in digests}) == len(figures["corpora"])
    if {"x1", "x10"} <= figures["corpora"].keys():
        rss = [figures["corpora"][c]["cores"][harness.ALL]["taxiway"]["peak_rss_mib"] for c in ("x1", "x10")]
        figures["taxiway_peak_rss_x10_over_x1"] = round(rss[1] / rss[0], 2)
    text = table(figures)
    notes = ("Each measurement a fresh process, timed after imports and reading the texts (taxiway: end to end "
             "from the manifest); 'cores 1' = pinned to one core; tokens exclude EOS separators; speed vs "
             "tiktoken = tiktoken median / method median.")
    harness.finish(__file__, args, notes, figures, text, started)

if __name__ == "__main__":
    main()
