"""A small packed corpus and helpers shared by the trainer tests (real tokenizer, real packing)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time
from pathlib import Path

import psutil
import pytest
import torch

from conftest import TINY
from pipelines import manifest
from pipelines.config import load_config
from pipelines.launch import local
from pipelines.launch.spec import launch_spec, write_trainer_spec
from trainer import shards
from trainer.spec import TrainSpec


def gang_pids(gang_id: str) -> list[int]:
    """Live processes carrying the gang's marker, found with psutil: an oracle independent of the
    launcher's own ``/proc`` scan (``local.processes``), which the code under test uses to clean up."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and proc.environ().get(local.MARKER) == gang_id:
                found.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


BASE = ["tokenizer.vocab_size=280", "train.steps=16", "checkpoint.every_steps=4", "checkpoint.keep_last_n=10",
        "train.deterministic=true", "train.log_every=1"]


def write_corpus(root: Path) -> list[str]:
    """60 short train and 10 val documents with their manifest under ``root``; returns the
    ``data.*`` config overrides that point at them (vocabulary 280 fits them)."""
    for split, n in (("train", 60), ("val", 10)):
        (root / split).mkdir(parents=True)
        for i in range(n):
            (root / split / f"{i}.txt").write_text(f"doc {i} in {split}: " + "lorem ipsum dolor sit amet " * (i % 7 + 2))
    manifest.write(root / "manifest.jsonl", manifest.scan(root))
    return [f"data.train={root / 'train'}", f"data.val={root / 'val'}", f"data.manifest={root / 'manifest.jsonl'}",
            "tokenizer.vocab_size=280"]


def make_corpus(tmp_path_factory):
    """Body of each module's ``corpus`` fixture: yields (RunConfig, packed folder) — 60 short train
    documents, seq_len 32, 2 nodes x 1 process, 16 deterministic steps, a checkpoint every 4."""
    root = tmp_path_factory.mktemp("corpus")
    env = pytest.MonkeyPatch()
    env.setenv("TAXIWAY_HOME", str(root / "home"))
    cfg = load_config(TINY, [*write_corpus(root), *BASE])
    from pipelines import tokenize

    yield cfg, tokenize.pack_splits(cfg).path
    env.undo()


def with_overrides(cfg, **sections):
    """``cfg`` with fields replaced, e.g. ``train={"steps": 8}``."""
    update = {name: getattr(cfg, name).model_copy(update=fields) for name, fields in sections.items()}
    return cfg.model_copy(update=update)


def one_rank_spec(cfg, packed: Path, run_dir: Path) -> TrainSpec:
    """The trainer contract for one in-process rank."""
    return dataclasses.replace(TrainSpec.load(write_trainer_spec(cfg, run_dir, packed)), world_size=1)


def submit_gang(cfg, packed: Path, run_dir: Path, parent: tuple[Path, Path | None] | None = None,
                **env: str) -> local.Handle:
    """A local gang for ``cfg`` with extra environment (e.g. ``TAXIWAY_TEST_*`` fault hooks), continuing
    ``parent`` (its weights folder, and its full checkpoint or None) when given."""
    weights, full = parent or (None, None)
    write_trainer_spec(cfg, run_dir, packed, parent_weights=weights, parent_checkpoint=full)
    spec = launch_spec(cfg, run_dir)
    return local.submit(dataclasses.replace(spec, env={**spec.env, **env}))


def finish_gang(handle: local.Handle, timeout_s: float = 120) -> None:
    """Wait for the gang to exit, clean it up, and require that it succeeded."""
    state = wait_for(lambda: (s := local.poll(handle)).state != local.RUNNING and s, timeout_s, "the gang to exit")
    local.cleanup(handle, grace_s=5)
    assert state.state == local.SUCCEEDED, state.detail


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def events(run_dir: Path, name: str | None = None) -> list[dict]:
    return [e for e in read_jsonl(run_dir / "events.jsonl") if name is None or e["event"] == name]


def status(run_dir: Path) -> dict:
    return json.loads((run_dir / "status.json").read_text())


def wait_for(predicate, timeout_s: float, what: str, poll_s: float = 0.05):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if result := predicate():
            return result
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def kill9(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def saved(folder: Path) -> dict:
    """Every model and optimizer tensor of a checkpoint (either format), by name: ``model/<name>``,
    ``optim/<param>/<state>``."""
    state = shards.read_whole(folder)
    out = {f"model/{k}": v for k, v in state["model"].items()}
    for name, per_param in state["optim"]["state"].items():
        out.update({f"optim/{name}/{k}": v for k, v in per_param.items()})
    return out


def saved_model(run_dir: Path, step: int) -> dict:
    """The model state of ``run_dir``'s checkpoint of ``step``, whole."""
    return shards.read_whole(run_dir / "checkpoints" / f"step-{step:08d}")["model"]


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
