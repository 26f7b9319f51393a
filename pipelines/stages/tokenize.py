"""Tokenize-and-pack (docs/tokenize.md): ``plan`` trains or loads the tokenizer and cuts the data
into shards of file groups; ``shard`` encodes one shard into the token cache; ``reduce`` packs the
cached groups into fixed-length windows (plus a refresh's replay of old data and its held-out new
data). Airflow maps the shards over tasks; ``run`` spreads them over local processes."""

from __future__ import annotations

import logging
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from pipelines import tokenize as tk
from pipelines.config import RunConfig
from pipelines.preflight.decontaminate import effective_data
from pipelines.refresh.plan import RefreshPlan
from pipelines.run_folder import RunFolder
from pipelines.stages import parent
from pipelines.tokenize import shards as sharding

log = logging.getLogger("taxiway.stages")


def data(cfg: RunConfig, run_dir: Path) -> RunConfig:
    """What tokenize packs: the data the preflight gate let through (its decontaminated val split,
    if any), with the parent model's tokenizer when training continues from a parent."""
    cfg = effective_data(cfg, run_dir)
    weights = parent.weights(cfg, run_dir)
    if weights is not None:
        cfg = cfg.model_copy(update={"tokenizer": cfg.tokenizer.model_copy(
            update={"path": str(parent.tokenizer(cfg, weights))})})
    return cfg


def plan(cfg: RunConfig, run_dir: Path, *, max_shards: int | None = None, min_shards: int = 1) -> list[dict[str, Any]]:
    """Train or load the tokenizer and write the shards ``shard`` encodes (``tokenize/shards/``),
    between ``min_shards`` (as whole groups allow) and ``max_shards`` of them."""
    return sharding.plan(data(cfg, run_dir), RunFolder(run_dir).tokenize_shards, max_shards, min_shards)


def shard(run_dir: Path, index: int) -> dict[str, Any]:
    """Encode one shard of the plan into the token cache (on one thread: shards scale over processes)."""
    return sharding.encode(RunFolder(run_dir).tokenize_shards, index)


def reduce(cfg: RunConfig, run_dir: Path, refresh: RefreshPlan | None = None) -> tk.Packed:
    """Packs ``data``; the groups ``shard`` encoded are read from the cache (any missing are encoded
    here). A refresh's plan adds its replay of old data and packs its held-out new data."""
    cfg = data(cfg, run_dir)
    if refresh is None:
        return tk.pack_splits(cfg, run_dir)
    packed = tk.pack_splits(cfg, run_dir, replay=refresh.replay(cfg))
    if (fresh := refresh.fresh_data(cfg, run_dir)) is not None:  # the held-out new data, for the refresh gate
        tk.pack_splits(fresh, run_dir, splits=("val",), link=RunFolder(run_dir).fresh_packed_link)
    return packed


def run(cfg: RunConfig, run_dir: Path, workers: int | None = None, refresh: RefreshPlan | None = None) -> tk.Packed:
    """The whole stage in this process: with ``workers``, the encoding spread over that many processes
    of one thread each (as the mapped tasks spread it over Airflow workers) before the pack; without,
    the pack encodes on the engine's own threads."""
    if workers is None:
        return reduce(cfg, run_dir, refresh)
    shards = plan(cfg, run_dir, min_shards=4 * workers)  # a process idles 1/4 of a shard's time at most
    if workers == 1:
        encoded = [shard(run_dir, s["shard"]) for s in shards]
    else:  # fork: the workers start without importing anything again (spawn cost ~0.5 s of a few-second stage);
        # safe here: a worker builds its own encoder on its own threads (never one the parent built) and
        # encodes with tiktoken or HF's single-document encode, never HF's pool the parent may have trained on
        with ProcessPoolExecutor(min(workers, len(shards)) or 1, mp_context=get_context("fork")) as pool:
            encoded = list(pool.map(partial(shard, run_dir), [s["shard"] for s in shards]))
    log.info("%d shard(s) on %d process(es): %d group(s) encoded, %d cached", len(shards), workers,
             sum(e["encoded"] for e in encoded), sum(e["cached"] for e in encoded))
    return reduce(cfg, run_dir, refresh)
