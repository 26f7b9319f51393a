"""Near-duplicate train/val overlap with MinHash LSH (datasketch).

LSH (threshold = ``preflight.overlap_jaccard``) proposes candidate pairs; each candidate is then
confirmed by its estimated Jaccard so the report only lists pairs at or above the threshold.
A val document counts as contaminated when any train document confirms against it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from pipelines.config import RunConfig
from pipelines.documents import read_documents, split_files
from pipelines.preflight.report import CheckResult

_WORD = re.compile(r"\w+")


def shingles(text: str, n: int) -> set[bytes]:
    """Word n-grams of the lower-cased text; a short document is one shingle."""
    words = _WORD.findall(text.lower())
    if len(words) <= n:
        return {" ".join(words).encode()} if words else set()
    return {" ".join(words[i:i + n]).encode() for i in range(len(words) - n + 1)}


def _signatures(docs: Iterable[tuple[str, str]], cfg: RunConfig):
    from datasketch import MinHash

    for doc_id, text in docs:
        grams = shingles(text, cfg.preflight.shingle_words)
        if not grams:
            continue
        mh = MinHash(num_perm=cfg.preflight.num_perm, seed=1)
        mh.update_batch(list(grams))
        yield doc_id, mh


def _docs(spec: str, fmt: str | None, root: Path) -> Iterable[tuple[str, str]]:
    for path in split_files(spec):
        for doc_id, text in read_documents(path, fmt):
            yield _relative(doc_id, root), text


def _relative(doc_id: str, root: Path) -> str:
    """Doc ids as the manifest spells paths (relative to its folder) where possible."""
    try:
        return Path(doc_id).relative_to(root).as_posix()
    except ValueError:
        return doc_id


def check_overlap(cfg: RunConfig, plot_path: Path | None = None) -> CheckResult:
    from datasketch import MinHashLSH

    p = cfg.preflight
    root = Path(cfg.data.manifest).resolve().parent
    lsh = MinHashLSH(threshold=p.overlap_jaccard, num_perm=p.num_perm)
    train = dict(_signatures(_docs(cfg.data.train, cfg.data.format, root), cfg))
    for doc_id, mh in train.items():
        lsh.insert(doc_id, mh)
    pairs, best, n_val = [], [], 0
    for doc_id, mh in _signatures(_docs(cfg.data.val, cfg.data.format, root), cfg):
        n_val += 1
        scores = sorted(((train[c].jaccard(mh), c) for c in lsh.query(mh)), reverse=True)
        best.append(scores[0][0] if scores else 0.0)
        pairs += [{"train": c, "val": doc_id, "jaccard": round(j, 4)}
                  for j, c in scores if j >= p.overlap_jaccard]
    if n_val == 0:
        return CheckResult("overlap", False, "validation split has no documents", {})
    contaminated = len({pair["val"] for pair in pairs})
    fraction = contaminated / n_val
    passed = fraction <= p.max_overlap_fraction
    if plot_path is not None:
        _plot(best, p.overlap_jaccard, plot_path)
    message = (f"{contaminated}/{n_val} val documents ({fraction:.2%}) near-duplicate train "
               f"(Jaccard >= {p.overlap_jaccard}); limit {p.max_overlap_fraction:.2%}")
    return CheckResult("overlap", passed, message, {
        "contaminated_fraction": fraction, "pairs": pairs, "val_documents": n_val,
        "train_documents": len(train), "jaccard_threshold": p.overlap_jaccard,
        "num_perm": p.num_perm, "lsh_bands": lsh.b, "lsh_rows": lsh.r,
    })


def _plot(best: list[float], threshold: float, path: Path) -> None:
    """Histogram of each val document's best Jaccard against train."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pipelines import atomic

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.hist(best, bins=20, range=(0, 1), color="#4477aa")
    ax.axvline(threshold, color="#cc3311", linestyle="--", label=f"threshold {threshold}")
    ax.set_xlabel("best estimated Jaccard vs train (LSH candidates)")
    ax.set_ylabel("val documents")
    ax.legend()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    atomic.write_bytes(path, buf.getvalue())
