"""One function per pipeline stage: the seam the CLI, the Airflow tasks and the tests share.

Each stage reads the run folder's ``config.yaml`` and earlier stages' outputs, and writes its
own outputs atomically into the run folder.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipelines.config import RunConfig, load_config
from pipelines.errors import BadInput, CheckFailed
from pipelines.registry import lineage
from pipelines.run_folder import RunFolder, State
from trainer import fsio

log = logging.getLogger("taxiway.stages")


class StageInputError(BadInput):
    """An earlier stage's output is missing: the stages ran out of order."""


class SmokeFailed(CheckFailed):
    """The trainer's one-process smoke test failed: config or code cannot train."""


def prepare(cfg: RunConfig, run_dir: Path) -> Path:
    """Write ``config.yaml`` and its sha256: the run's identity. Idempotent for the same config."""
    run_dir.mkdir(parents=True, exist_ok=True)
    folder = RunFolder(run_dir)
    path = folder.config
    if path.exists() and path.read_text() != cfg.to_yaml():
        raise BadInput(f"{run_dir}: run folder already holds a different config; use another --run-dir")
    fsio.write_text(path, cfg.to_yaml())
    fsio.write_text(folder.config_sha256, cfg.sha256() + "\n")
    return path


def load_run_config(run_dir: Path) -> RunConfig:
    path = RunFolder(run_dir).config
    if not path.exists():
        raise StageInputError(f"{path}: missing; the run folder was not prepared")
    return load_config(path)


def _require(path: Path, stage: str) -> Path:
    if not path.exists():
        raise StageInputError(f"{path}: missing; run the '{stage}' stage first")
    return path


def preflight(cfg: RunConfig, run_dir: Path, workers: int | None = None):
    from pipelines import preflight as pf

    return pf.run(cfg, run_dir, workers)


def tokenize_data(cfg: RunConfig, run_dir: Path) -> RunConfig:
    """What tokenize packs: the data the preflight gate let through (its decontaminated val split,
    if any), with the parent model's tokenizer when training continues from a parent."""
    from pipelines.preflight.decontaminate import effective_data

    cfg = effective_data(cfg, run_dir)
    parent = parent_weights(cfg, RunFolder(run_dir).parent)
    if parent is not None:
        cfg = cfg.model_copy(update={"tokenizer": cfg.tokenizer.model_copy(
            update={"path": str(parent_tokenizer(cfg, parent))})})
    return cfg


def tokenize_plan(cfg: RunConfig, run_dir: Path, max_shards: int | None = None,
                  min_shards: int = 1) -> list[dict[str, Any]]:
    """Train or load the tokenizer and write the shards ``tokenize_shard`` encodes (``tokenize/shards/``),
    between ``min_shards`` (as whole groups allow) and ``max_shards`` of them."""
    from pipelines.tokenize import shards

    return shards.plan(tokenize_data(cfg, run_dir), RunFolder(run_dir).tokenize_shards, max_shards, min_shards)


def tokenize_shard(run_dir: Path, index: int) -> dict[str, Any]:
    """Encode one shard of the plan into the token cache (on one thread: shards scale over processes)."""
    from pipelines.tokenize import shards

    return shards.encode(RunFolder(run_dir).tokenize_shards, index)


def tokenize_on(cfg: RunConfig, run_dir: Path, workers: int):
    """``tokenize`` with the encoding spread over ``workers`` processes of one thread each (one:
    this process), as the mapped tasks spread it over Airflow workers; then packs."""
    from concurrent.futures import ProcessPoolExecutor
    from functools import partial
    from multiprocessing import get_context

    shards = tokenize_plan(cfg, run_dir, min_shards=4 * workers)  # a process idles 1/4 of a shard's time at most
    if workers == 1:
        encoded = [tokenize_shard(run_dir, s["shard"]) for s in shards]
    else:  # fork: the workers start without importing anything again (spawn cost ~0.5 s of a few-second stage);
        # safe here: a worker builds its own encoder on its own threads (never one the parent built) and
        # encodes with tiktoken or HF's single-document encode, never HF's pool the parent may have trained on
        with ProcessPoolExecutor(min(workers, len(shards)) or 1, mp_context=get_context("fork")) as pool:
            encoded = list(pool.map(partial(tokenize_shard, run_dir), [s["shard"] for s in shards]))
    log.info("%d shard(s) on %d process(es): %d group(s) encoded, %d cached", len(shards), workers,
             sum(e["encoded"] for e in encoded), sum(e["cached"] for e in encoded))
    return tokenize(cfg, run_dir)


def tokenize(cfg: RunConfig, run_dir: Path):
    """Packs ``tokenize_data``; the groups ``tokenize_shard`` encoded are read from the cache."""
    from pipelines import tokenize as tk
    from pipelines.refresh import plan as refresh_plan
    from pipelines.refresh import replay
    from pipelines.refresh.assemble import fresh_config

    cfg = tokenize_data(cfg, run_dir)
    plan = refresh_plan.of_run(run_dir)
    if plan is None:
        return tk.run(cfg, run_dir)
    packed = tk.run(cfg, run_dir, replay=replay.of_run(cfg, plan))
    if (fresh := fresh_config(cfg, run_dir)) is not None:  # the held-out new data, for the refresh gate
        tk.run(fresh, run_dir, splits=("val",), link=RunFolder(run_dir).fresh_packed_link)
    return packed


def parent_tokenizer(cfg: RunConfig, parent_dir: Path) -> Path:
    """The parent's tokenizer; an explicit ``tokenizer.path`` that differs from it is refused."""

    theirs = _require(parent_dir / "tokenizer.json", "register (the parent has no tokenizer.json)")
    if cfg.tokenizer.path and fsio.sha256_file(cfg.tokenizer.path) != fsio.sha256_file(theirs):
        raise BadInput(f"tokenizer.path {cfg.tokenizer.path} differs from the parent model's tokenizer "
                         f"({cfg.parent}, sha256 {fsio.sha256_file(theirs)[:12]}…): continued training must keep "
                         "the parent's vocabulary; unset tokenizer.path")
    return theirs


def parent_weights(cfg: RunConfig, dest: Path) -> Path | None:
    if not cfg.parent:
        return None
    from pipelines import registry

    return registry.download(registry.resolve_version(cfg.parent), dest)


def trainer_spec(cfg: RunConfig, run_dir: Path, smoke: bool = False) -> Path:
    """The trainer's spec for the packed data (and parent weights): the run's own, or the smoke
    test's (which names its own, emptied, output folder). The run's own is refused (``DiskFull``)
    when its disk cannot hold its checkpoints: every launcher writes it just before launching."""
    from pipelines import disk
    from pipelines.launch.spec import write_trainer_spec

    folder = RunFolder(run_dir)
    _require(folder.packed_link, "tokenize")
    if not smoke:
        disk.check_training_room(cfg, folder.checkpoints)
    packed = Path(lineage.packed_info(run_dir)["path"])
    if smoke:
        shutil.rmtree(folder.smoke, ignore_errors=True)
    weights = parent_weights(cfg, folder.parent)
    return write_trainer_spec(cfg, run_dir, packed, weights, smoke=smoke,
                              parent_checkpoint=parent_checkpoint(cfg, weights) if weights else None)


def parent_checkpoint(cfg: RunConfig, weights: Path) -> Path | None:
    """The parent's full checkpoint (optimizer state too) at the step its weights were exported from:
    from the run folder it was trained in (its version's ``taxiway.run_dir``) while that still holds
    it, else the copy logged with the version (``registry.log_checkpoint``); else None, and training
    continues from the weights alone. Either way it is logged."""
    from pipelines import registry
    from trainer import checkpoint

    mv = registry.resolve_version(cfg.parent, cfg.registry)
    tags = mv.tags or {}
    origin = tags.get("taxiway.run_dir")
    exported = json.loads((weights / "model.json").read_text()).get("global_step")

    def made_this_version(path: Path | None) -> bool:
        meta = json.loads((path / "meta.json").read_text()) if path is not None else {}
        return (meta.get("global_step") == exported and meta.get("format") == checkpoint.FORMAT
                and meta.get("config_sha256") == tags.get("taxiway.config_sha256"))

    sources = (("its run folder", lambda: checkpoint.at_step(RunFolder(Path(origin)).checkpoints, exported)
                if origin and isinstance(exported, int) else None),
               ("the checkpoint logged with it", lambda: registry.download_checkpoint(
                   mv, weights.with_name(f"{weights.name}-checkpoint"), cfg.registry)))
    for where, find in sources:
        if made_this_version(path := find()):
            log.info("continuing %s from its full checkpoint (weights and optimizer state), from %s: %s",
                     cfg.parent, where, path)
            return path
    log.info("continuing %s from its weights only (optimizer state starts fresh): no valid checkpoint of step %s "
             "in its run folder (%s) nor logged with it", cfg.parent, exported, origin or "none recorded")
    return None


def smoke(cfg: RunConfig, run_dir: Path, timeout_s: float = 600.0) -> dict[str, Any]:
    """The trainer's ``--smoke`` on one process: config and code errors fail here in seconds,
    before a gang of nodes is scheduled."""
    import subprocess
    import sys

    spec = trainer_spec(cfg, run_dir, smoke=True)
    proc = subprocess.run([sys.executable, "-m", "trainer", "--spec", str(spec), "--smoke"], capture_output=True,
                          text=True, timeout=timeout_s, env={**os.environ, "OMP_NUM_THREADS": "1"})
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise SmokeFailed(f"trainer smoke test failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    return json.loads(lines[-1])


def train(cfg: RunConfig, run_dir: Path, on_poll: Callable[[], None] | None = None) -> Path:
    """Run the trainer as a local gang; returns the exported model folder."""
    from pipelines.launch import local
    from pipelines.launch.spec import launch_spec

    spec = trainer_spec(cfg, run_dir)
    local.run(launch_spec(cfg, run_dir, spec), on_poll=on_poll)
    return finish_train(run_dir)


def launch_gang(cfg: RunConfig, run_dir: Path):
    """Start the training gang without waiting (the Airflow sensor watches it); returns its handle."""
    from pipelines.launch import local
    from pipelines.launch.spec import launch_spec

    spec = trainer_spec(cfg, run_dir)
    return local.submit(launch_spec(cfg, run_dir, spec))


def finish_train(run_dir: Path) -> Path:
    """Complete the exported model folder with the tokenizer files evaluation and registry need."""
    model_dir = RunFolder(run_dir).model
    _require(model_dir / "model.safetensors", "train")
    packed = Path(lineage.packed_info(run_dir)["path"])
    for name in ("tokenizer.json", "token_bytes.npy"):
        fsio.write_bytes(model_dir / name, (packed / name).read_bytes())
    return model_dir


def final_checkpoint_ready(run_dir: Path) -> tuple[bool, str]:
    """Training succeeded, its newest valid checkpoint is the final step and the export matches it."""
    from trainer import checkpoint

    folder = RunFolder(run_dir)
    status = folder.read_status()
    if status.get("state") != State.SUCCEEDED:
        return False, f"trainer state is {status.get('state')!r}, waiting for 'succeeded'"
    newest = checkpoint.latest_valid(folder.checkpoints)
    if newest is None:
        return False, "no valid checkpoint yet"
    step = json.loads((newest / "meta.json").read_text())["global_step"]
    exported = folder.model / "model.json"
    if not exported.exists():
        return False, "weights not exported yet"
    if step != status.get("step") or json.loads(exported.read_text()).get("global_step") != step:
        return False, f"newest valid checkpoint {newest.name} is not the final step {status.get('step')}"
    return True, f"final checkpoint {newest.name} is complete and valid; export matches it"


def progress_line(run_dir: Path, elapsed_s: float) -> str | None:
    """One human line from ``status.json``: step/total, loss, tokens/s, ETA (``elapsed_s`` since launch)."""
    s = RunFolder(run_dir).read_status()
    if not s:
        return None
    step, total = s.get("step") or 0, s.get("total_steps") or 0
    if s.get("loss") is None or s.get("tokens_per_s") is None:  # a relaunch that logged no step yet
        from pipelines.registry.metrics import last_record

        last = last_record(run_dir)
        s = {**s, "loss": s.get("loss") or last.get("loss"), "tokens_per_s": s.get("tokens_per_s") or last.get("tokens_per_s")}
    eta = f"{elapsed_s / step * (total - step):.0f}s" if step else "?"
    return (f"{s.get('state')} step {step}/{total} loss {s.get('loss')} "
            f"tokens/s {s.get('tokens_per_s')} eta {eta}")


def progress_ticker(run_dir: Path, emit: Callable[[str], None], every_s: float = 10.0) -> Callable[[], None]:
    """A poll callback that emits ``progress_line`` at most every ``every_s`` seconds."""
    started, last = time.monotonic(), [0.0]

    def tick() -> None:
        if time.monotonic() - last[0] >= every_s:
            last[0] = time.monotonic()
            if line := progress_line(run_dir, time.monotonic() - started):
                emit(line)

    return tick


def evaluate(cfg: RunConfig, run_dir: Path, baseline: str | None = None) -> dict[str, Any]:
    """Candidate vs baseline in bits per byte, gated by a paired bootstrap; writes ``eval/``
    (report.json last). ``baseline`` (a models:/ URI or ``floor``) overrides ``eval.baseline``:
    registration passes the champion that moved while this run was evaluated."""
    from eval import gate
    from eval import report as eval_report
    from eval.floor import floor
    from eval.model_files import load_model, resolve_device
    from eval.score import score
    from pipelines import registry
    from pipelines.preflight.decontaminate import effective_data
    from pipelines.refresh.assemble import fresh_config

    e, folder = cfg.eval, RunFolder(run_dir)
    _require(folder.packed_link, "tokenize")
    packed = Path(lineage.packed_info(run_dir)["path"])
    device = resolve_device(e.device)
    candidate, _ = load_model(_require(folder.model, "train"), device)
    cand = score(candidate, packed, "val", e.batch_size, e.max_batches, device)
    chosen = registry.resolve_baseline(cfg, folder.baseline, baseline)
    if chosen is None:
        base = floor(e.floor, packed, cand.sequences)
        why = ("no champion at registration" if baseline == "floor" else
               "eval.baseline=floor" if e.baseline == "floor" else "no champion registered")
        info = {"kind": "floor", "floor": e.floor, "note": why, "label": f"{e.floor} floor",
                "name": None, "uri": None, "version": None}
    else:
        model, _ = load_model(chosen.folder, device, chosen.weights_sha256)
        base = score(model, _baseline_packed(effective_data(cfg, run_dir), packed, chosen.folder), "val", e.batch_size,
                     e.max_batches, device)
        info = {"kind": chosen.kind, "label": f"{chosen.kind} models:/{chosen.name}/{chosen.version}",
                "name": chosen.name, "uri": chosen.uri, "version": chosen.version}
    decision, paired = gate.decide(cand, base, info["label"], e.min_improvement, e.confidence,
                                   e.bootstrap_samples, e.seed)
    report = eval_report.build(cand, base, info, decision, _generations(cfg, candidate, packed, device),
                               str(folder.model))
    if chosen is not None and folder.fresh_packed_link.exists():  # a refresh: judged on the new data too
        fresh_packed = Path(json.loads(folder.fresh_packed_link.read_text())["path"])
        cand_f = score(candidate, fresh_packed, "val", e.batch_size, e.max_batches, device)
        base_f = score(model, _baseline_packed(fresh_config(cfg, run_dir), fresh_packed, chosen.folder),
                       "val", e.batch_size, e.max_batches, device)
        fresh, _ = gate.decide(cand_f, base_f, info["label"], e.min_improvement, e.confidence, e.bootstrap_samples,
                               e.seed)
        passed, reason = gate.refresh_decision(decision, fresh, cfg.refresh.max_regression_bpb)
        report = eval_report.with_refresh(report, cand_f, base_f, fresh, passed, reason,
                                          cfg.refresh.max_regression_bpb)
    for name, data in eval_report.files(report, paired, decision).items():
        fsio.write_bytes(folder.eval / name, data)
    log.info("%s", report["reason"])
    return report


def _baseline_packed(data: RunConfig, packed: Path, baseline_dir: Path) -> Path:
    """The val split of ``data`` as the baseline reads it: the candidate's windows (``packed``) when
    the tokenizers match, else the same val text packed with the baseline's own tokenizer."""
    from pipelines import tokenize as tk

    theirs = _require(baseline_dir / "tokenizer.json", "register (the baseline has no tokenizer.json)")
    if fsio.sha256_file(theirs) == fsio.sha256_file(packed / "tokenizer.json"):
        return packed
    other = data.model_copy(update={"tokenizer": data.tokenizer.model_copy(update={"path": str(theirs)})})
    return tk.run(other, splits=("val",)).path


def _generations(cfg: RunConfig, model, packed: Path, device: str) -> list[dict[str, Any]]:
    """The candidate's continuations of ``eval.prompts``, seeded, for a person to read."""
    from eval.generate import complete
    from pipelines.tokenize import bpe

    e = cfg.eval
    tok = bpe.load(packed / "tokenizer.json", cfg.tokenizer.eos_token)
    eos = tok.token_to_id(cfg.tokenizer.eos_token)
    return [{"prompt": prompt, "seed": e.seed + i, "temperature": e.temperature, "top_k": e.top_k,
             "text": complete(model, tok, prompt, e.generate_tokens, e.temperature, e.top_k, e.seed + i, eos, device)}
            for i, prompt in enumerate(e.prompts)]


def register(cfg: RunConfig, run_dir: Path, run_key: str, airflow: dict[str, str] | None = None) -> dict[str, Any]:
    """Log and register the model (idempotent per ``run_key``), then move ``champion`` or
    ``challenger`` to it. This stage owns re-evaluation: when the champion moved since the model
    was evaluated, it is evaluated again against the new champion and promotion is tried again, at
    most ``registry.max_reevaluations`` times; a champion that kept moving leaves it ``challenger``.
    A refresh is not re-evaluated: it continues its parent, so a champion that is no longer that
    parent leaves it ``challenger`` and its batches new to the champion's next refresh."""
    from pipelines import registry
    from pipelines.refresh import ledger
    from pipelines.refresh import plan as refresh_plan

    folder, reg = RunFolder(run_dir), cfg.registry
    report = json.loads(_require(folder.eval_report, "evaluate").read_text())
    registered = registry.register(cfg, run_dir, run_key, report, airflow)
    if (plan := refresh_plan.of_run(run_dir)) is not None:
        ledger.record(reg, registered, run_dir, plan)
    outcome = registry.promote(reg, registered.version, report)
    if plan is not None and isinstance(outcome, registry.ChampionMoved):
        outcome = registry.set_challenger(reg, registered.version, refresh_plan.parent_moved(plan, outcome))
    for attempt in range(1, reg.max_reevaluations + 1):
        if not isinstance(outcome, registry.ChampionMoved):
            break
        log.info("champion of %s is version %s, not %s as evaluated: evaluating again against it",
                 reg.model_name, outcome.found, outcome.expected or "none (floor)")
        report = evaluate(cfg, run_dir, outcome.baseline)
        registry.record_reevaluation(reg, registered, run_dir, report, attempt)
        outcome = registry.promote(reg, registered.version, report)
    if isinstance(outcome, registry.ChampionMoved):
        outcome = registry.set_challenger(reg, registered.version, outcome.reason)
    result = registered.record(outcome.alias, outcome.reason)
    fsio.write_json(folder.registry_record, result)
    return result


def summary(run_dir: Path) -> str:
    folder = RunFolder(run_dir)
    reg = json.loads(_require(folder.registry_record, "register").read_text())
    ev = json.loads(folder.eval_report.read_text())
    c, b, g = ev["candidate"], ev["baseline"], ev["gate"]
    return "\n".join([
        "Taxiway run summary",
        f"  registered model : {reg['model_name']} version {reg['version']} (alias '{reg['alias']}')",
        f"  model URI        : {reg['uri']}",
        f"  validation       : {c['loss']:.4f} nats/token, {c['bits_per_byte']:.4f} bits/byte, "
        f"perplexity {c['perplexity']:.2f}",
        f"  baseline         : {b['label']}{' (' + b['note'] + ')' if b.get('note') else ''}: "
        f"{b['loss']:.4f} nats/token, {b['bits_per_byte']:.4f} bits/byte",
        f"  gate             : {'PASSED' if ev['passed'] else 'FAILED'} - improvement {g['improvement_bpb']:+.4f} "
        f"bits/byte, {g['confidence']:.0%} lower bound {g['lower_bpb']:+.4f} (required > 0 and "
        f">= {g['min_improvement']:+.4f})",
        f"  alias reason     : {reg.get('reason', ev['reason'])}",
        f"  MLflow run       : {reg['run_id']} (experiment '{reg['experiment']}')",
        f"  run folder       : {run_dir}",
        f"  report           : {folder.eval / 'report.md'}",
    ])
