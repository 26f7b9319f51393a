"""Evaluation against a baseline (docs/evaluation.md): the candidate and the baseline (the champion,
the refresh's parent, or a floor) scored in bits per byte on the same validation text, the
difference gated by a paired bootstrap; ``eval/`` written with ``report.json`` last. A refresh is
judged on its held-out new data too, and reports forgetting: parent vs candidate on the fixed set and
on the held-out slices of the earlier batches its parent was trained on."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipelines import registry
from pipelines import tokenize as tk
from pipelines.config import RunConfig, TokenizerConfig
from pipelines.preflight.decontaminate import effective_data
from pipelines.refresh.layout import layout
from pipelines.refresh.plan import RefreshPlan
from pipelines.registry import lineage
from pipelines.run_folder import RunFolder
from pipelines.stages.prepare import require
from pipelines.tokenize import bpe
from trainer import fsio

log = logging.getLogger("taxiway.stages")


def run(cfg: RunConfig, run_dir: Path, baseline: str | None = None, refresh: RefreshPlan | None = None) -> dict[str, Any]:
    """Candidate vs baseline; returns the report. ``baseline`` (a models:/ URI or ``floor``) overrides
    ``eval.baseline``: registration passes the champion that moved while this run was evaluated.
    ``refresh``: the plan of a refresh run, whose held-out new data is a second gate."""
    # torch (~1 s) and the eval package: DAG files import this module through their tasks
    from eval import gate
    from eval import report as eval_report
    from eval.floor import floor
    from eval.model_files import load_model, resolve_device
    from eval.score import score

    e, folder = cfg.eval, RunFolder(run_dir)
    require(folder.packed_link, "tokenize")
    packed = Path(lineage.packed_info(run_dir)["path"])
    device = resolve_device(e.device)
    candidate, _ = load_model(require(folder.model, "train"), device)
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
    fresh_data = refresh.fresh_data(cfg, run_dir) if refresh is not None and chosen is not None else None
    if fresh_data is not None:  # a refresh: judged on its held-out new data too
        fresh_packed = Path(json.loads(require(folder.fresh_packed_link, "tokenize").read_text())["path"])
        cand_f = score(candidate, fresh_packed, "val", e.batch_size, e.max_batches, device)
        base_f = score(model, _baseline_packed(fresh_data, fresh_packed, chosen.folder),
                       "val", e.batch_size, e.max_batches, device)
        fresh, _ = gate.decide(cand_f, base_f, info["label"], e.min_improvement, e.confidence, e.bootstrap_samples,
                               e.seed)
        passed, reason = gate.refresh_decision(decision, fresh, cfg.refresh.max_regression_bpb)
        report = eval_report.with_refresh(report, cand_f, base_f, fresh, passed, reason,
                                          cfg.refresh.max_regression_bpb)
    if refresh is not None and chosen is not None:
        rows, left_out = _forgetting(cfg, run_dir, candidate, model, packed, chosen.folder, device)
        report = eval_report.with_forgetting(report, rows, left_out)
    for name, data in eval_report.files(report, paired, decision).items():
        fsio.write_bytes(folder.eval / name, data)
    log.info("%s", report["reason"])
    return report


def _forgetting(cfg: RunConfig, run_dir: Path, candidate: Any, parent: Any, packed: Path, parent_dir: Path,
                device: str) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """Parent vs candidate bits/byte on each earlier batch's held-out slice (``assemble`` placed them,
    newest first), packed with the candidate's tokenizer; and the batches left out, with why."""
    from eval.score import score  # torch: as in ``run``

    assembled = json.loads(require(RunFolder(run_dir).refresh_assembled, "assemble").read_text())
    out, e = layout(cfg, run_dir), cfg.eval
    rows = []
    for batch in assembled.get("earlier", []):
        bid = batch["batch"]
        data = cfg.model_copy(update={
            "data": cfg.data.model_copy(update={"val": str(out.earlier(bid)), "manifest": str(out.earlier_manifest(bid))}),
            "tokenizer": cfg.tokenizer.model_copy(update={"path": str(packed / "tokenizer.json")})})
        mine = tk.pack_splits(data, splits=("val",)).path
        cand = score(candidate, mine, "val", e.batch_size, e.max_batches, device)
        base = score(parent, _baseline_packed(data, mine, parent_dir), "val", e.batch_size, e.max_batches, device)
        rows.append({"batch": bid, "version": batch["version"], "files": batch["files"],
                     "parent_bpb": base.bits_per_byte, "candidate_bpb": cand.bits_per_byte})
    return rows, assembled.get("earlier_left_out", [])


def _baseline_packed(data: RunConfig, packed: Path, baseline_dir: Path) -> Path:
    """The val split of ``data`` as the baseline reads it: the candidate's windows (``packed``) when
    the tokenizers match, else the same val text packed with the baseline's own tokenizer."""
    theirs = require(baseline_dir / "tokenizer.json", "register (the baseline has no tokenizer.json)")
    if fsio.sha256_file(theirs) == fsio.sha256_file(packed / "tokenizer.json"):
        return packed
    other = data.model_copy(update={"tokenizer": data.tokenizer.model_copy(update={"path": str(theirs)})})
    return tk.pack_splits(other, splits=("val",)).path


def continuations(model_ref: str, prompts: list[str], max_new_tokens: int, temperature: float, top_k: int | None,
                  seed: int, device: str) -> Iterator[str]:
    """Each prompt continued by a registered model (``models:/NAME@ALIAS``, ``models:/NAME/VERSION``)
    or a model folder, one at a time: weights and tokenizer come from MLflow, checked against the
    recorded sha256."""
    from eval.model_files import load_model, resolve_device  # torch: as in ``run``

    folder, sha256 = registry.fetch_model(model_ref)
    device = resolve_device(device)
    model, _ = load_model(folder, device, sha256)
    yield from _continue(model, folder / "tokenizer.json", TokenizerConfig().eos_token, prompts, max_new_tokens,
                         temperature, top_k, seed, device)


def _generations(cfg: RunConfig, model: Any, packed: Path, device: str) -> list[dict[str, Any]]:
    """The candidate's continuations of ``eval.prompts``, seeded, for a person to read."""
    e = cfg.eval
    texts = _continue(model, packed / "tokenizer.json", cfg.tokenizer.eos_token, e.prompts, e.generate_tokens,
                      e.temperature, e.top_k, e.seed, device)
    return [{"prompt": prompt, "seed": e.seed + i, "temperature": e.temperature, "top_k": e.top_k, "text": text}
            for i, (prompt, text) in enumerate(zip(e.prompts, texts, strict=True))]


def _continue(model: Any, tokenizer: Path, eos_token: str, prompts: list[str], max_new_tokens: int,
              temperature: float, top_k: int | None, seed: int, device: str) -> Iterator[str]:
    """Prompt ``i`` continued with seed ``seed + i``, stopping at ``eos_token``."""
    from eval.generate import complete  # torch: as in ``run``

    tok = bpe.load(tokenizer, eos_token)
    eos = tok.token_to_id(eos_token)
    for i, prompt in enumerate(prompts):
        yield complete(model, tok, prompt, max_new_tokens, temperature, top_k, seed + i, eos, device)
