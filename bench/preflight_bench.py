"""Preflight benchmark: train/val overlap detection and manifest hashing, side by side.

Same corpus, same parameters (128 permutations, 5-word shingles, threshold 0.8), each method in
its own fresh process (timed after imports; peak RSS = the process's VmHWM):

- taxiway: ``pipelines.preflight.overlap`` with 1 and 2 worker processes;
- datasketch: plain usage — one ``MinHash`` per document with ``update_batch`` of the shingle
  strings, ``MinHashLSH.insert``/``query``, candidates kept when ``MinHash.jaccard`` >= 0.8;
- rensa: the same with ``RMinHash``/``RMinHashLSH`` (16 bands).

Corpora: the demo corpus (stdlib sources) and a 10x set built from it with planted
near-duplicates (each document in 10 variants with 0-35% of words replaced, variants spread
over train and val). Accuracy: exact Jaccard by brute force (Python sets of shingle strings) of
sampled val documents against every train document. Manifest hashing: ``sha256sum`` vs
``pipelines.manifest.hash_files`` with 1 and 2 threads, warm page cache.

    .venv/bin/python bench/preflight_bench.py [--repeats 3] [--out bench/results/preflight.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

NUM_PERM, SHINGLE, THRESHOLD = 128, 5, 0.8
MUTATION = (0.0, 0.005, 0.01, 0.02, 0.03, 0.05, 0.08, 0.12, 0.2, 0.35)
_WORD = re.compile(rb"[a-z0-9_\x80-\xff]+")  # taxiway's word definition, on ASCII-lower-cased UTF-8


# --- corpora -------------------------------------------------------------------------------

def build_corpora(base: Path) -> dict[str, Path]:
    from pipelines import manifest
    from pipelines.demo_data import write_demo_data

    one = base / "x1"
    write_demo_data(one, seed=0)
    ten = base / "x10"
    rng = random.Random(0)
    docs = sorted((one / "train").iterdir()) + sorted((one / "val").iterdir())
    for split in ("train", "val"):
        (ten / split).mkdir(parents=True)
    for i, path in enumerate(docs):
        text = path.read_text()
        for k, rate in enumerate(MUTATION):
            split = "val" if (i * 10 + k) % 10 == (i % 10) and k % 3 == 1 else "train"
            out = re.sub(r"\w+", lambda m, r=rate: f"w{rng.randrange(10**6)}" if rng.random() < r else m.group(0), text)
            (ten / split / f"{path.stem}.v{k}.txt").write_text(out)
    manifest.write(ten / "manifest.jsonl", manifest.scan(ten))
    return {"x1": one, "x10": ten}


def _texts(folder: Path) -> list[tuple[str, str]]:
    return [(f"{folder.name}/{p.name}", p.read_text()) for p in sorted(folder.iterdir())]


def _shingle_strings(text: str) -> set[bytes]:
    """The shingles, built the plain-Python way a datasketch or rensa user would."""
    words = _WORD.findall(text.encode().lower())
    if len(words) <= SHINGLE:
        return {b" ".join(words)} if words else set()
    return {b" ".join(words[i:i + SHINGLE]) for i in range(len(words) - SHINGLE + 1)}


# --- methods (each run in a child process) -------------------------------------------------

def run_taxiway(data: Path, workers: int) -> dict:
    from pipelines.config import load_config
    from pipelines.preflight.overlap import check_overlap

    cfg = load_config(REPO / "configs" / "tiny.yaml", [
        f"data.train={data / 'train'}", f"data.val={data / 'val'}", f"data.manifest={data / 'manifest.jsonl'}",
        f"preflight.num_perm={NUM_PERM}", f"preflight.shingle_words={SHINGLE}", f"preflight.overlap_jaccard={THRESHOLD}"])
    import datasketch  # noqa: F401  (imports outside the timed region, as for the others)
    import fsspec  # noqa: F401

    t = time.perf_counter()
    result = check_overlap(cfg, workers=workers)
    return {"seconds": time.perf_counter() - t, "pairs": [(p["train"], p["val"]) for p in result.details["pairs"]]}


def run_datasketch(data: Path) -> dict:
    from datasketch import MinHash, MinHashLSH

    t = time.perf_counter()
    lsh = MinHashLSH(threshold=THRESHOLD, num_perm=NUM_PERM)
    train = {}
    for key, text in _texts(data / "train"):
        m = MinHash(num_perm=NUM_PERM)
        m.update_batch(list(_shingle_strings(text)))
        lsh.insert(key, m)
        train[key] = m
    pairs = []
    for key, text in _texts(data / "val"):
        m = MinHash(num_perm=NUM_PERM)
        m.update_batch(list(_shingle_strings(text)))
        pairs += [(c, key) for c in lsh.query(m) if train[c].jaccard(m) >= THRESHOLD]
    return {"seconds": time.perf_counter() - t, "pairs": pairs}


def run_rensa(data: Path) -> dict:
    from rensa import RMinHash, RMinHashLSH

    t = time.perf_counter()
    lsh = RMinHashLSH(threshold=THRESHOLD, num_perm=NUM_PERM, num_bands=16)
    train, keys = [], []
    for i, (key, text) in enumerate(_texts(data / "train")):
        m = RMinHash(num_perm=NUM_PERM, seed=1)
        m.update([s.decode() for s in _shingle_strings(text)])
        lsh.insert(i, m)
        train.append(m)
        keys.append(key)
    pairs = []
    for key, text in _texts(data / "val"):
        m = RMinHash(num_perm=NUM_PERM, seed=1)
        m.update([s.decode() for s in _shingle_strings(text)])
        pairs += [(keys[c], key) for c in lsh.query(m) if train[c].jaccard(m) >= THRESHOLD]
    return {"seconds": time.perf_counter() - t, "pairs": pairs}


def run_hash(data: Path, workers: int) -> dict:
    from pipelines import storage
    from pipelines.manifest import hash_files

    locs = storage.list_files(str(data / "train")) + storage.list_files(str(data / "val"))
    t = time.perf_counter()
    hash_files(locs, workers)
    return {"seconds": time.perf_counter() - t}


def _peak_mib() -> float:
    """This process's peak RSS (VmHWM: unlike ru_maxrss it does not carry the parent's peak
    over fork + exec); threads included, worker processes not (see ``child``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(method: str, data: str, workers: int) -> None:
    fn = {"taxiway": lambda: run_taxiway(Path(data), workers), "datasketch": lambda: run_datasketch(Path(data)),
          "rensa": lambda: run_rensa(Path(data)), "hash": lambda: run_hash(Path(data), workers)}[method]
    out = fn()
    out["peak_rss_mib"] = _peak_mib()
    # the largest forked worker's peak (it counts the pages it still shares with this process)
    out["worker_peak_rss_mib"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(json.dumps(out))


def measure(method: str, data: Path, workers: int = 1) -> dict:
    # No method uses BLAS; OpenBLAS's threads spin for a while after numpy/scipy import and would
    # take a core from the start of a timed run, a large share of the short x1 runs (docs/benchmarks.md).
    env = {**os.environ, "PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, __file__, "--child", method, str(data), str(workers)],
                          capture_output=True, text=True, check=True, env=env)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def sha256sum(data: Path) -> float:
    files = [str(p) for split in ("train", "val") for p in sorted((data / split).iterdir())]
    t = time.perf_counter()
    subprocess.run(["xargs", "-0", "sha256sum"], input="\0".join(files).encode(), check=True, capture_output=True)
    return time.perf_counter() - t


# --- accuracy ------------------------------------------------------------------------------

def accuracy(data: Path, reported: list[tuple[str, str]], sample: int, seed: int = 0) -> dict:
    train = [(k, _shingle_strings(t)) for k, t in _texts(data / "train")]
    val = _texts(data / "val")
    chosen = random.Random(seed).sample(val, min(sample, len(val)))
    chosen_keys = {k for k, _ in chosen}
    truth = {}
    for vkey, text in chosen:
        vs = _shingle_strings(text)
        for tkey, ts in train:
            inter = len(vs & ts)
            if inter:
                truth[(tkey, vkey)] = inter / (len(vs) + len(ts) - inter)
    got = {p for p in map(tuple, reported) if p[1] in chosen_keys}
    must = {p for p, j in truth.items() if j >= THRESHOLD + 0.05}
    false = {p for p in got if truth.get(p, 0.0) <= THRESHOLD - 0.1}
    return {"val_sampled": len(chosen), "true_pairs_j_ge_0.85": len(must), "found_of_those": len(must & got),
            "recall": len(must & got) / len(must) if must else None, "reported": len(got), "false_j_le_0.7": len(false),
            "precision": 1 - len(false) / max(1, len(got))}


def _mb(data: Path) -> float:
    return sum(p.stat().st_size for split in ("train", "val") for p in (data / split).iterdir()) / 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sample", type=int, default=60, help="val documents checked by brute force")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--child", nargs=3, metavar=("METHOD", "DATA", "WORKERS"))
    args = ap.parse_args()
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]))
        return
    results: dict = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpus": os.cpu_count(),
                     "params": {"num_perm": NUM_PERM, "shingle_words": SHINGLE, "threshold": THRESHOLD}}
    with tempfile.TemporaryDirectory() as tmp:
        corpora = build_corpora(Path(tmp))
        for name, data in corpora.items():
            row: dict = {"mb": round(_mb(data), 2), "documents": sum(1 for s in ("train", "val") for _ in (data / s).iterdir())}
            methods = {"taxiway:1": ("taxiway", 1), "taxiway:2": ("taxiway", 2),
                       "datasketch": ("datasketch", 1), "rensa": ("rensa", 1)}
            runs = {m: [measure(method, data, workers) for _ in range(args.repeats)]
                    for m, (method, workers) in methods.items()}
            for m, rs in runs.items():
                sec = statistics.median(r["seconds"] for r in rs)
                row[m] = {"median_s": round(sec, 3), "mb_per_s": round(row["mb"] / sec, 2),
                          "peak_rss_mib": round(max(r["peak_rss_mib"] for r in rs), 1),
                          "worker_peak_rss_mib": round(max(r["worker_peak_rss_mib"] for r in rs), 1),
                          "pairs": len(rs[0]["pairs"])}
            t1 = row["taxiway:1"]["median_s"]
            row["speedup_vs_datasketch"] = round(row["datasketch"]["median_s"] / t1, 2)
            row["speedup_vs_rensa"] = round(row["rensa"]["median_s"] / t1, 2)
            row["speedup_1_to_2_processes"] = round(t1 / row["taxiway:2"]["median_s"], 2)
            row["accuracy"] = accuracy(data, runs["taxiway:1"][0]["pairs"], args.sample)
            sha = statistics.median(sha256sum(data) for _ in range(args.repeats + 1))
            h1 = [measure("hash", data, 1) for _ in range(args.repeats)]
            h2 = [measure("hash", data, 2) for _ in range(args.repeats)]
            row["hashing"] = {
                "sha256sum_mb_per_s": round(row["mb"] / sha, 1),
                "taxiway_1_thread_mb_per_s": round(row["mb"] / statistics.median(r["seconds"] for r in h1), 1),
                "taxiway_2_threads_mb_per_s": round(row["mb"] / statistics.median(r["seconds"] for r in h2), 1),
                "peak_rss_mib_1_thread": round(max(r["peak_rss_mib"] for r in h1), 1)}
            row["hashing"]["per_core_vs_sha256sum"] = round(
                row["hashing"]["taxiway_1_thread_mb_per_s"] / row["hashing"]["sha256sum_mb_per_s"], 2)
            results[name] = row
            print(json.dumps({name: row}, indent=2), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
