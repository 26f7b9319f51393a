"""Generated bench corpora of any size from the demo corpus, with variation rather than copies.

Each demo document (the 1x corpus, ``pipelines.demo_data``) yields ``scale`` variants: the original,
then variants whose words are replaced at a rate drawn per variant from a synthetic vocabulary that
grows with the scale (so the tokenizer meets new words, and a bigger corpus is not the smaller one
repeated). A variant stays in its original's split. Planted on purpose, at fractions that keep the
preflight gate passing with its default limits: about 1% exact duplicates (of an earlier variant,
same split) and about 2% of val documents near-duplicating a train document (word replacement rate
0.5–3%, Jaccard above the default 0.8), so the duplicate and overlap checks have real work that
grows with the corpus.

    .venv/bin/python bench/corpus.py OUT_DIR --scale 100   # ~1 GB; writes OUT_DIR/manifest.jsonl
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SPLITS = ("train", "val")
_WORDS = re.compile(r"(\w+)")
_SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"] + ["qu", "th", "sh", "ch", "x"]
DUPLICATE, NEAR_VAL = 0.01, 0.02      # fractions of variants planted as exact / cross-split near copies


def vocabulary(size: int, rng: np.random.Generator) -> list[str]:
    """``size`` distinct made-up words of 2–5 syllables, in random order (the Zipf draw's common words
    are then not all alike)."""
    words: set[str] = set()
    while len(words) < size:
        n = int(rng.integers(2, 6))
        words.add("".join(_SYLLABLES[i] for i in rng.integers(0, len(_SYLLABLES), n)))
    return [str(w) for w in rng.permutation(sorted(words))]


def mutate(pieces: list[str], rate: float, vocab: list[str], rng: np.random.Generator) -> str:
    """``pieces`` (``re.split`` by words: words at odd indices) with each word replaced at ``rate``
    by a word of ``vocab`` drawn Zipf-like (a few common, a long tail)."""
    out = list(pieces)
    words = np.arange(1, len(out), 2)
    chosen = words[rng.random(len(words)) < rate]
    picks = np.minimum(rng.zipf(1.3, len(chosen)) - 1, len(vocab) - 1)
    for i, w in zip(chosen.tolist(), picks.tolist(), strict=True):
        out[i] = vocab[w]
    return "".join(out)


def varied(one: Path, out: Path, scale: int, seed: int = 0) -> Path:
    """Write ``out/{train,val}/`` and ``out/manifest.jsonl``: ``scale`` variants of every document of
    the corpus ``one``; returns the manifest path. Deterministic for a seed."""
    sys.path.insert(0, str(REPO))
    from pipelines import manifest
    from trainer import fsio

    rng = np.random.default_rng(seed)
    vocab = vocabulary(2000 * scale, rng)
    docs = {s: [(p, _WORDS.split(p.read_text())) for p in sorted((one / s).iterdir())] for s in SPLITS}
    with fsio.staged_dir(out) as stage:
        written: dict[str, list[Path]] = {s: [] for s in SPLITS}
        for split in SPLITS:
            (stage / split).mkdir()
            for path, pieces in docs[split]:
                for k in range(scale):
                    roll = rng.random()
                    if k == 0:
                        text = "".join(pieces)
                    elif roll < DUPLICATE and written[split]:
                        text = written[split][int(rng.integers(len(written[split])))].read_text()
                    elif split == "val" and roll < DUPLICATE + NEAR_VAL:
                        source = docs["train"][int(rng.integers(len(docs["train"])))][1]
                        text = mutate(source, float(rng.uniform(0.005, 0.03)), vocab, rng)
                    else:
                        text = mutate(pieces, float(rng.uniform(0.3, 0.7)), vocab, rng)
                    target = stage / split / f"{path.stem}.v{k:03d}.txt"
                    target.write_text(text)
                    written[split].append(target)
        manifest.write(stage / "manifest.jsonl", manifest.scan(stage))
    return out / "manifest.jsonl"


def build(base: Path, scale: int, seed: int = 0) -> Path:
    """The ``scale``x corpus under ``base/x<scale>`` (and the 1x demo corpus under ``base/x1``),
    made once and reused: the folder appears only when complete."""
    sys.path.insert(0, str(REPO))
    from pipelines.demo_data import write_demo_data

    one = base / "x1"
    if not (one / "manifest.jsonl").is_file():
        write_demo_data(one, seed=0, force=True)
    out = base / f"x{scale}"
    if scale > 1 and not (out / "manifest.jsonl").is_file():
        varied(one, out, scale, seed)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base", type=Path)
    ap.add_argument("--scale", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(build(args.base, args.scale, args.seed) / "manifest.jsonl")


if __name__ == "__main__":
    main()
