"""Preflight benchmark: train/val overlap detection side by side on one process each, the
multi-process figures apart, every method's pairs diffed against exact Jaccard; manifest hashing.

Same corpus, same parameters (128 permutations, 5-word shingles, threshold 0.8, LSH 16 bands x 8
rows — the optimum for 0.8 with recall weighted, as Taxiway derives it); each method in its own
fresh process, timed after imports, from reading the files to the pairs; peak RSS = VmHWM. The
repeats go round by round (each method once a round), so a drift in the machine's speed shifts all alike.
"One process" is pinned to one core, so thread pools inside a library (rensa's batch APIs) get
one core too.

- taxiway: ``pipelines.preflight.overlap.check_overlap`` (numpy shingles and signatures, datasketch
  LSH with batch-computed keys, exact confirmation), 1 worker process; 2 worker processes apart;
- datasketch as its docs advise for speed: ``MinHash.bulk`` with xxhash (``xxh32_intdigest``),
  ``MinHashLSH`` filled in an ``insertion_session``, candidates kept when ``MinHash.jaccard`` >= 0.8;
- rensa ``RMinHash``: ``RMinHash.from_token_sets``, ``RMinHashLSH.insert_many`` / ``query_all``,
  candidates kept when the sketch's ``jaccard`` >= 0.8;
- rensa ``CMinHash``: ``CMinHash.from_token_sets``; rensa has no LSH for it, so bands of its
  digests go into dicts (the same 16 x 8), candidates kept when ``jaccard`` >= 0.8;
- datatrove: its MinHash pipeline, signature -> buckets -> cluster (``MinhashDedupSignature``,
  ``MinhashDedupBuckets``, ``MinhashDedupCluster`` on ``LocalPipelineExecutor``), 16 buckets x 8
  hashes, words split as Taxiway splits them and no punctuation/number normalization; train and
  val as one corpus (datatrove deduplicates a corpus); its pairs are the train/val pairs inside
  each cluster it forms. 1 worker on one core; 2 workers apart.

datasketch and rensa get the same shingles, built the plain-Python way a user would (regex words,
joined 5-grams); Python shingling is part of their time, as numpy shingling is part of Taxiway's.

Accuracy: the exact Jaccard of every val x train pair (shingle strings hashed with xxh64, a sparse
product of document x shingle matrices), then per method recall for J >= 0.85, in the band
0.80-0.85 and 0.70-0.80 (where the planted variants sit), and what it reported below 0.70 and 0.80.

Corpora: the demo corpus (x1) and a 10x set built from it with planted near-duplicates (each
document in 10 variants with 0-35% of words replaced, variants spread over train and val).
Manifest hashing: ``sha256sum`` vs ``pipelines.manifest.hash_files`` with 1 and 2 threads.

Whole stage: ``taxiway preflight --workers 1`` and ``--workers 2`` (plan, shard scans, every
check, the gate), each a fresh process with an empty cache (its own ``TAXIWAY_HOME``), timed by
the parent from spawn to exit, imports included; compared 1 -> 2 workers and against datasketch
as advised doing overlap alone on one process.

    .venv/bin/python bench/preflight_bench.py [--repeats 3] [--slow-repeats 1] [--corpora x1,x10] [--out bench/results]

writes ``preflight.json`` (raw figures) and ``preflight.md`` (the tables) in ``--out``.
"""

from __future__ import annotations

import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

REPO = harness.REPO
NUM_PERM, SHINGLE, THRESHOLD, BANDS, ROWS = 128, 5, 0.8, 16, 8
MUTATION = (0.0, 0.005, 0.01, 0.02, 0.03, 0.05, 0.08, 0.12, 0.2, 0.35)
_WORD = re.compile(rb"[a-z0-9_\x80-\xff]+")  # taxiway's word definition, on ASCII-lower-cased UTF-8
# name: (method, workers, cores)
ONE_PROCESS = {"taxiway": ("taxiway", 1, harness.ONE), "datasketch": ("datasketch", 1, harness.ONE),
               "rensa_r": ("rensa_r", 1, harness.ONE), "rensa_c": ("rensa_c", 1, harness.ONE),
               "datatrove": ("datatrove", 1, harness.ONE)}
MULTI_PROCESS = {"taxiway:2": ("taxiway", 2, harness.ALL), "datatrove:2": ("datatrove", 2, harness.ALL)}
SLOW = {"datatrove"}  # the slowest method: --slow-repeats
BANDS_J = {"ge_0.85": (0.85, 2.0), "0.80_0.85": (0.80, 0.85), "0.70_0.80": (0.70, 0.80), "0.70_0.85": (0.70, 0.85)}


# --- corpora -------------------------------------------------------------------------------

def build_corpora(base: Path) -> dict[str, Path]:
    sys.path.insert(0, str(REPO))
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


def _token_sets(docs: list[tuple[str, str]]) -> list[list[bytes]]:
    return [list(_shingle_strings(text)) for _, text in docs]


def _shingle_strings(text: str) -> set[bytes]:
    """The shingles, built the plain-Python way a datasketch or rensa user would."""
    words = _WORD.findall(text.encode().lower())
    if len(words) <= SHINGLE:
        return {b" ".join(words)} if words else set()
    return {b" ".join(words[i:i + SHINGLE]) for i in range(len(words) - SHINGLE + 1)}


# --- methods (each run in a child process) -------------------------------------------------

def run_taxiway(data: Path, workers: int) -> dict:
    from pipelines.config import load_config
    from pipelines.heap import set_policy
    from pipelines.preflight.overlap import check_overlap

    set_policy()  # as the process running the stage does (taxiway's main, a task's start)
    cfg = load_config(REPO / "configs" / "tiny.yaml", [
        f"data.train={data / 'train'}", f"data.val={data / 'val'}", f"data.manifest={data / 'manifest.jsonl'}",
        f"preflight.num_perm={NUM_PERM}", f"preflight.shingle_words={SHINGLE}", f"preflight.overlap_jaccard={THRESHOLD}"])
    import datasketch  # noqa: F401  (imports outside the timed region, as for the others)
    import fsspec  # noqa: F401

    t = time.perf_counter()
    result = check_overlap(cfg, workers=workers)
    seconds = time.perf_counter() - t
    assert (result.details["lsh_bands"], result.details["lsh_rows"]) == (BANDS, ROWS)
    return {"seconds": seconds, "pairs": [(p["train"], p["val"]) for p in result.details["pairs"]]}


def run_datasketch(data: Path) -> dict:
    import xxhash
    from datasketch import MinHash, MinHashLSH

    t = time.perf_counter()
    train = _texts(data / "train")
    sigs = MinHash.bulk(_token_sets(train), num_perm=NUM_PERM,
                        hashfunc=xxhash.xxh32_intdigest)
    lsh = MinHashLSH(threshold=THRESHOLD, num_perm=NUM_PERM, params=(BANDS, ROWS))
    with lsh.insertion_session() as session:
        for (key, _), m in zip(train, sigs, strict=True):
            session.insert(key, m)
    by_key = {key: m for (key, _), m in zip(train, sigs, strict=True)}
    val = _texts(data / "val")
    pairs = []
    for (key, _), m in zip(val, MinHash.bulk(_token_sets(val), num_perm=NUM_PERM,
                                             hashfunc=xxhash.xxh32_intdigest), strict=True):
        pairs += [(c, key) for c in lsh.query(m) if by_key[c].jaccard(m) >= THRESHOLD]
    return {"seconds": time.perf_counter() - t, "pairs": pairs}


def run_rensa_r(data: Path) -> dict:
    from rensa import RMinHash, RMinHashLSH

    t = time.perf_counter()
    train = _texts(data / "train")
    sigs = RMinHash.from_token_sets(_token_sets(train),
                                    num_perm=NUM_PERM, seed=1)
    lsh = RMinHashLSH(threshold=THRESHOLD, num_perm=NUM_PERM, num_bands=BANDS)
    lsh.insert_many(sigs)
    val = _texts(data / "val")
    val_sigs = RMinHash.from_token_sets(_token_sets(val),
                                        num_perm=NUM_PERM, seed=1)
    pairs = [(train[c][0], key) for (key, _), m, hits in zip(val, val_sigs, lsh.query_all(val_sigs), strict=True)
             for c in hits if sigs[c].jaccard(m) >= THRESHOLD]
    return {"seconds": time.perf_counter() - t, "pairs": pairs}


def run_rensa_c(data: Path) -> dict:
    from rensa import CMinHash

    t = time.perf_counter()
    train = _texts(data / "train")
    sigs = CMinHash.from_token_sets(_token_sets(train),
                                    num_perm=NUM_PERM, seed=1)
    tables: list[dict[tuple, list[int]]] = [defaultdict(list) for _ in range(BANDS)]
    for i, m in enumerate(sigs):
        digest = m.digest()
        for b, table in enumerate(tables):
            table[tuple(digest[b * ROWS:(b + 1) * ROWS])].append(i)
    val = _texts(data / "val")
    pairs = []
    for (key, _), m in zip(val, CMinHash.from_token_sets(_token_sets(val),
                                                         num_perm=NUM_PERM, seed=1), strict=True):
        digest = m.digest()
        hits = {c for b, table in enumerate(tables) for c in table.get(tuple(digest[b * ROWS:(b + 1) * ROWS]), ())}
        pairs += [(train[c][0], key) for c in hits if sigs[c].jaccard(m) >= THRESHOLD]
    return {"seconds": time.perf_counter() - t, "pairs": pairs}


def run_datatrove(data: Path, workers: int, scratch: Path) -> dict:
    import xxhash
    from datatrove.data import Document
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup.minhash import (
        MinhashConfig,
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupSignature,
    )
    from datatrove.utils.text import TextNormConfig
    from datatrove.utils.word_tokenizers import WordTokenizer

    class Words(WordTokenizer):
        """Taxiway's words (runs of [a-z0-9_] and non-ASCII), so every method shingles alike."""

        pattern = re.compile(r"[a-z0-9_\u0080-\U0010ffff]+")

        def word_tokenize(self, text: str) -> list[str]:
            return self.pattern.findall(text)

        def sent_tokenize(self, text: str) -> list[str]:
            return [text]

        def span_tokenize(self, text: str) -> list[tuple[int, int]]:
            return [m.span() for m in self.pattern.finditer(text)]

    paths = sorted((data / "train").iterdir()) + sorted((data / "val").iterdir())

    def read(_data, rank: int = 0, world_size: int = 1):
        for path in paths[rank::world_size]:
            yield Document(text=path.read_text(), id=f"{path.parent.name}/{path.name}")

    config = MinhashConfig(n_grams=SHINGLE, num_buckets=BANDS, hashes_per_bucket=ROWS, seed=1,
                           norm_config=TextNormConfig(norm_whitespace=False, remove_punctuation=False,
                                                      norm_unicode_diacritics=False, norm_numbers=False))
    sigs, buckets, clusters, logs = (scratch / n for n in ("sigs", "buckets", "clusters", "logs"))
    signature = MinhashDedupSignature(output_folder=str(sigs), config=config, language=Words())
    # datatrove 0.10.1 declares xxhash<4, which hashed str as UTF-8; the venv pins 4.1.0,
    # which wants bytes: the same hash, given the bytes
    signature._hash_func = lambda text: xxhash.xxh64_intdigest(text.encode())
    steps = [([read, signature], workers),
             ([MinhashDedupBuckets(input_folder=str(sigs), output_folder=str(buckets), config=config)], BANDS),
             ([MinhashDedupCluster(input_folder=str(buckets), output_folder=str(clusters), config=config)], 1)]
    t = time.perf_counter()
    for i, (pipeline, tasks) in enumerate(steps):
        LocalPipelineExecutor(pipeline=pipeline, tasks=tasks, workers=min(workers, tasks), start_method="fork",
                              logging_dir=str(logs / str(i)), skip_completed=False).run()
    seconds = time.perf_counter() - t
    return {"seconds": seconds, "pairs": _datatrove_pairs(buckets, paths, workers)}


def _datatrove_pairs(buckets: Path, paths: list[Path], workers: int) -> list[tuple[str, str]]:
    """The train/val pairs inside each cluster datatrove forms (its cluster step unites the
    duplicate pairs of every bucket; a cluster keeps one document). Read after the timed run."""
    import numpy as np

    parent = list(range(len(paths)))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for f in buckets.glob("*.dups"):
        for f1, d1, f2, d2 in np.fromfile(f, dtype="<u4").reshape(-1, 4).tolist():
            if f1 != 0xFFFFFFFF:  # SENTINEL rows name index matches; there is no index here
                parent[find(f1 + d1 * workers)] = find(f2 + d2 * workers)
    members = defaultdict(list)
    for i in range(len(paths)):
        members[find(i)].append(f"{paths[i].parent.name}/{paths[i].name}")
    return [(t, v) for group in members.values() if len(group) > 1
            for t in group if t.startswith("train/") for v in group if v.startswith("val/")]


def run_hash(data: Path, workers: int) -> dict:
    from pipelines import storage
    from pipelines.manifest import hash_files

    locs = storage.list_files(str(data / "train")) + storage.list_files(str(data / "val"))
    t = time.perf_counter()
    hash_files(locs, workers)
    return {"seconds": time.perf_counter() - t}


def child(method: str, data: str, workers: int, cores: str) -> None:
    harness.pin(cores)
    sys.path.insert(0, str(REPO))
    path = Path(data)
    with tempfile.TemporaryDirectory() as scratch:
        out = {"taxiway": lambda: run_taxiway(path, workers), "datasketch": lambda: run_datasketch(path),
               "rensa_r": lambda: run_rensa_r(path), "rensa_c": lambda: run_rensa_c(path),
               "datatrove": lambda: run_datatrove(path, workers, Path(scratch)),
               "hash": lambda: run_hash(path, workers)}[method]()
    out["peak_rss_mib"] = harness.peak_mib()
    print(json.dumps(out))


def stage_seconds(data: Path, workers: int, scratch: Path) -> float:
    """Wall time of the whole ``taxiway preflight`` in a fresh process with an empty cache (it
    exits 1 on the x10 corpus: the planted near-duplicates fail the gate, as they should)."""
    home = Path(tempfile.mkdtemp(dir=scratch))
    sets = [f"data.train={data / 'train'}", f"data.val={data / 'val'}", f"data.manifest={data / 'manifest.jsonl'}",
            f"preflight.num_perm={NUM_PERM}", f"preflight.shingle_words={SHINGLE}", f"preflight.overlap_jaccard={THRESHOLD}"]
    cmd = [str(Path(sys.executable).parent / "taxiway"), "preflight", "-c", str(REPO / "configs" / "tiny.yaml"),
           *[a for s in sets for a in ("--set", s)], "--run-dir", str(home / "run"), "--workers", str(workers)]
    env = {**os.environ, "TAXIWAY_HOME": str(home), "PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1"}
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    seconds = time.perf_counter() - t
    if proc.returncode not in (0, 1):
        sys.exit(f"taxiway preflight --workers {workers} failed:\n{proc.stderr[-4000:]}")
    return seconds


def sha256sum(data: Path) -> float:
    files = [str(p) for split in ("train", "val") for p in sorted((data / split).iterdir())]
    t = time.perf_counter()
    subprocess.run(["xargs", "-0", "sha256sum"], input="\0".join(files).encode(), check=True, capture_output=True)
    return time.perf_counter() - t


# --- accuracy ------------------------------------------------------------------------------

def exact_jaccard(data: Path, floor: float = 0.5) -> dict[tuple[str, str], float]:
    """Exact shingle Jaccard of every val x train pair at or above ``floor`` (shingle strings
    hashed with xxh64: a collision among the corpus's ~10^7 shingles has odds ~10^-5)."""
    import numpy as np
    import xxhash
    from scipy import sparse

    def matrix(docs: list[tuple[str, str]]) -> tuple[list[str], list[np.ndarray]]:
        return [k for k, _ in docs], [np.unique(np.fromiter((xxhash.xxh64_intdigest(s) for s in _shingle_strings(t)),
                                                            np.uint64)) for _, t in docs]

    train_keys, train_sets = matrix(_texts(data / "train"))
    val_keys, val_sets = matrix(_texts(data / "val"))
    sets = train_sets + val_sets
    _, column = np.unique(np.concatenate(sets), return_inverse=True)
    rows = np.repeat(np.arange(len(sets)), [len(s) for s in sets])
    m = sparse.csr_matrix((np.ones(len(rows), np.int32), (rows, column.ravel())), shape=(len(sets), column.max() + 1))
    inter = (m[len(train_sets):] @ m[:len(train_sets)].T).tocoo()
    sizes = np.array([len(s) for s in sets])
    union = sizes[len(train_sets) + inter.row] + sizes[inter.col] - inter.data
    j = inter.data / union
    keep = j >= floor
    return {(train_keys[t], val_keys[v]): float(x) for v, t, x in zip(inter.row[keep], inter.col[keep], j[keep],
                                                                      strict=True)}


def accuracy(reported: list[tuple[str, str]], truth: dict[tuple[str, str], float]) -> dict:
    """Recall per Jaccard band, and what was reported below 0.70 and 0.80 (exact J; < 0.5 counts as 0)."""
    got = set(map(tuple, reported))
    out: dict = {"reported": len(got)}
    for name, (lo, hi) in BANDS_J.items():
        true = {p for p, j in truth.items() if lo <= j < hi}
        out[name] = {"true": len(true), "found": len(true & got),
                     "recall": round(len(true & got) / len(true), 4) if true else None}
    below = {p: truth.get(p, 0.0) for p in got}
    out["reported_below_0.70"] = sum(j < 0.70 for j in below.values())
    out["reported_below_0.80"] = sum(j < 0.80 for j in below.values())
    out["missed_ge_0.85"] = sorted(([t, v, round(j, 3)] for (t, v), j in truth.items() if j >= 0.85 and (t, v) not in got),
                                   key=lambda x: -x[2])[:5]
    out["false_below_0.70"] = sorted([t, v, round(j, 3)] for (t, v), j in below.items() if j < 0.70)[:5]
    return out


# --- main ----------------------------------------------------------------------------------

def _mb(data: Path) -> float:
    return sum(p.stat().st_size for split in ("train", "val") for p in (data / split).iterdir()) / 1e6


def _measure_all(methods: dict, data: Path, repeats: int, slow_repeats: int, mb: float) -> tuple[dict, dict]:
    """Round by round, every method once a round (the slow ones in their first ``slow_repeats``
    rounds): a machine whose speed drifts during the run shifts every method alike."""
    rows, pairs = {}, {}
    counts = {name: slow_repeats if method in SLOW else repeats for name, (method, _, _) in methods.items()}
    all_runs: dict[str, list[dict]] = {name: [] for name in methods}
    for r in range(max(counts.values(), default=0)):
        for name, (method, workers, cores) in methods.items():
            if r < counts[name]:
                all_runs[name].append(harness.measure(__file__, [method, str(data), str(workers)], cores))
    for name, (_, workers, cores) in methods.items():
        runs = all_runs[name]
        rows[name] = {**harness.summary(runs), "workers": workers, "cores": cores, "pairs": len(set(map(tuple, runs[0]["pairs"])))}
        rows[name]["mb_per_s"] = round(mb / rows[name]["median_s"], 2)
        pairs[name] = runs[0]["pairs"]
        print(json.dumps({name: {k: rows[name][k] for k in ("median_s", "pairs")}}), flush=True)
    return rows, pairs


def tables(figures: dict) -> str:
    out = []
    for name, row in figures["corpora"].items():
        out.append(f"### {name}: {row['mb']} MB, {row['documents']} documents\n")
        for title, group, ours in (("one process each (pinned to one core)", "one_process", "taxiway"),
                                   ("multi-process (all cores)", "multi_process", "taxiway:2")):
            rows = []
            for m, r in row[group].items():
                acc = row["accuracy"][m]
                rows.append([m, r["median_s"], r["mb_per_s"], r["peak_rss_mib"], r["pairs"],
                             f"{acc['ge_0.85']['found']}/{acc['ge_0.85']['true']}",
                             f"{acc['0.80_0.85']['found']}/{acc['0.80_0.85']['true']}",
                             f"{acc['0.70_0.80']['found']}/{acc['0.70_0.80']['true']}",
                             acc["reported_below_0.80"], acc["reported_below_0.70"],
                             row["ratios"].get(f"{ours}_vs_{m}", "")])
            out.append(f"{title}\n\n" + harness.markdown(
                ["method", "median s", "MB/s", "peak RSS MiB", "pairs", "J>=0.85 found", "0.80-0.85 found",
                 "0.70-0.80 found", "reported J<0.80", "reported J<0.70", f"{ours} speed-up"], rows))
        st, r = row["stage"], row["ratios"]
        out.append(f"whole stage (`taxiway preflight`, fresh process, empty cache): 1 worker "
                   f"{st['workers_1']['median_s']} s, 2 workers {st['workers_2']['median_s']} s "
                   f"({r['stage_1_to_2_workers']}x); datasketch as advised, overlap alone: "
                   f"{r['stage_2_workers_vs_datasketch_overlap']}x the 2-worker stage\n")
        h = row["hashing"]
        out.append(f"manifest hashing: sha256sum {h['sha256sum_mb_per_s']} MB/s, taxiway 1 thread "
                   f"{h['taxiway_1_thread_mb_per_s']} MB/s ({h['per_core_vs_sha256sum']}x), 2 threads "
                   f"{h['taxiway_2_threads_mb_per_s']} MB/s\n")
    return "\n".join(out)


def main() -> None:
    args = harness.arguments(("METHOD", "DATA", "WORKERS"), "datatrove (the slowest)")
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]), args.cores)
        return
    started = harness.start()
    figures: dict = {"params": {"num_perm": NUM_PERM, "shingle_words": SHINGLE, "threshold": THRESHOLD,
                                "bands": BANDS, "rows": ROWS},
                     "repeats": args.repeats, "slow_repeats": args.slow_repeats, "corpora": {}}
    with tempfile.TemporaryDirectory() as tmp:
        corpora = build_corpora(Path(tmp))
        for name in args.corpora.split(","):
            data = corpora[name]
            row: dict = {"mb": round(_mb(data), 2),
                         "documents": sum(1 for s in ("train", "val") for _ in (data / s).iterdir())}
            row["one_process"], one_pairs = _measure_all(ONE_PROCESS, data, args.repeats, args.slow_repeats, row["mb"])
            row["multi_process"], multi_pairs = _measure_all(MULTI_PROCESS, data, args.repeats, args.slow_repeats,
                                                             row["mb"])
            t1 = row["one_process"]["taxiway"]["median_s"]
            row["ratios"] = {f"taxiway_vs_{m}": round(r["median_s"] / t1, 2) for m, r in row["one_process"].items()
                             if m != "taxiway"}
            row["ratios"]["taxiway:2_vs_datatrove:2"] = round(row["multi_process"]["datatrove:2"]["median_s"]
                                                              / row["multi_process"]["taxiway:2"]["median_s"], 2)
            row["ratios"]["taxiway_1_to_2_processes"] = round(t1 / row["multi_process"]["taxiway:2"]["median_s"], 2)
            truth = exact_jaccard(data)
            row["accuracy"] = {m: accuracy(p, truth) for m, p in {**one_pairs, **multi_pairs}.items()}
            true = {p for p, j in truth.items() if j >= 0.70}
            found = [set(map(tuple, p)) & true for p in {**one_pairs, **multi_pairs}.values()]
            row["pairs_j_ge_0.70"] = {"true": len(true), "found_by_every_method": len(set.intersection(*found)),
                                      "found_by_some_method": len(set.union(*found))}
            sha = statistics.median(sha256sum(data) for _ in range(args.repeats + 1))
            h1 = [harness.measure(__file__, ["hash", str(data), "1"], harness.ALL) for _ in range(args.repeats)]
            h2 = [harness.measure(__file__, ["hash", str(data), "2"], harness.ALL) for _ in range(args.repeats)]
            row["hashing"] = {
                "sha256sum_mb_per_s": round(row["mb"] / sha, 1),
                "taxiway_1_thread_mb_per_s": round(row["mb"] / statistics.median(r["seconds"] for r in h1), 1),
                "taxiway_2_threads_mb_per_s": round(row["mb"] / statistics.median(r["seconds"] for r in h2), 1),
                "peak_rss_mib_1_thread": round(max(r["peak_rss_mib"] for r in h1), 1)}
            row["hashing"]["per_core_vs_sha256sum"] = round(
                row["hashing"]["taxiway_1_thread_mb_per_s"] / row["hashing"]["sha256sum_mb_per_s"], 2)
            stage = {w: [stage_seconds(data, w, Path(tmp)) for _ in range(args.repeats)] for w in (1, 2)}
            row["stage"] = {f"workers_{w}": {"median_s": round(statistics.median(v), 3), "runs_s": [round(x, 3) for x in v]}
                            for w, v in stage.items()}
            row["ratios"]["stage_1_to_2_workers"] = round(row["stage"]["workers_1"]["median_s"]
                                                          / row["stage"]["workers_2"]["median_s"], 2)
            row["ratios"]["stage_2_workers_vs_datasketch_overlap"] = round(
                row["one_process"]["datasketch"]["median_s"] / row["stage"]["workers_2"]["median_s"], 2)
            figures["corpora"][name] = row
            print(json.dumps({name: {"ratios": row["ratios"], "pairs_j_ge_0.70": row["pairs_j_ge_0.70"]}}), flush=True)
    text = tables(figures)
    notes = ("Each measurement a fresh process, timed after imports, from reading the files to the pairs; one-process "
             "methods pinned to one core; taxiway speed-up = method median / taxiway (1 process) median; "
             "accuracy against exact Jaccard of every val x train pair.")
    harness.finish(__file__, args, notes, figures, text, started)

if __name__ == "__main__":
    main()
