"""Evaluation against a baseline (docs/evaluation.md): the candidate and the baseline (the champion,
the refresh's parent, or a floor) scored in bits per byte on the same validation text, the
difference gated by a paired bootstrap; ``eval/`` written with ``report.json`` last. One loop scores
every judged set: the deployment's validation set decides; a refresh is judged on its held-out new
data too, and reports forgetting (parent vs candidate on the held-out slices of the earlier batches
its parent was trained on); the run's own ``eval.report_sets`` are reported beside, never deciding."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pipelines import registry
from pipelines import tokenize as tk
from pipelines.config import RunConfig, TokenizerConfig
from pipelines.preflight.decontaminate import effective_data
from pipelines.refresh.layout import layout
from pipelines.refresh.plan import RefreshPlan
from pipelines.registry import lineage
from pipelines.run_folder import RunFolder
from pipelines.stages import pretrained
from pipelines.stages.prepare import require
from pipelines.tokenize import bpe
from trainer import fsio

log = logging.getLogger("taxiway.stages")


@dataclass(frozen=True)
class Judged:
    """One set the candidate and the baseline are scored on, and what its scores are for: ``gate``
    decides, ``refresh`` decides a refresh beside it, ``forgetting`` and ``reported`` are shown only."""

    name: str
    role: Literal["gate", "refresh", "forgetting", "reported"]
    data: RunConfig  # a config whose val split is this set
    packed: Path | None  # the candidate's windows of it; None: packed with the candidate's tokenizer when scored
    info: dict[str, Any] = field(default_factory=dict)


def judged_sets(cfg: RunConfig, run_dir: Path, packed: Path, refresh: RefreshPlan | None,
                against_model: bool) -> tuple[list[Judged], list[dict[str, str]]]:
    """The sets a run is judged on, the gate's first: the deployment's validation set (``data.val``,
    decontaminated where preflight did); a refresh's held-out new data and each earlier batch's held-out
    slice (``assemble`` placed them, newest first) when it is compared against a model; the run's own
    ``eval.report_sets``. Also the earlier batches left out, with why."""
    folder = RunFolder(run_dir)
    sets = [Judged("validation", "gate", effective_data(cfg, run_dir), packed)]
    left_out: list[dict[str, str]] = []
    if refresh is not None and against_model:
        if (fresh := refresh.fresh_data(cfg, run_dir)) is not None:
            link = require(folder.fresh_packed_link, "tokenize")
            sets.append(Judged("new data", "refresh", fresh, Path(json.loads(link.read_text())["path"])))
        assembled = json.loads(require(folder.refresh_assembled, "assemble").read_text())
        out = layout(cfg, run_dir)
        for batch in assembled.get("earlier", []):
            bid = batch["batch"]
            sets.append(Judged(f"batch {bid} held-out", "forgetting",
                               _val_of(cfg, str(out.earlier(bid)), str(out.earlier_manifest(bid))), None,
                               {k: batch[k] for k in ("batch", "version", "files")}))
        left_out = assembled.get("earlier_left_out", [])
    sets += [Judged(spec, "reported", _val_of(cfg, spec, cfg.data.manifest), None) for spec in cfg.eval.report_sets]
    return sets, left_out


def _val_of(cfg: RunConfig, val: str, manifest: str) -> RunConfig:
    return cfg.model_copy(update={"data": cfg.data.model_copy(update={"val": val, "manifest": manifest})})


def run(cfg: RunConfig, run_dir: Path, baseline: str | None = None, refresh: RefreshPlan | None = None) -> dict[str, Any]:
    """Candidate vs baseline on every judged set (``judged_sets``); returns the report. ``baseline`` (a
    models:/ URI or ``floor``) overrides ``eval.baseline``: registration passes the champion that moved
    while this run was evaluated. ``refresh``: the plan of a refresh run, whose held-out new data is a
    second gate."""
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
    chosen = registry.resolve_baseline(cfg, folder.baseline, baseline)
    if chosen is None and e.baseline != "floor" and (start := pretrained.folder(cfg, run_dir)) is not None:
        # no champion yet: the pretrained model the run started from is what it must beat
        chosen = registry.Baseline("pretrained", str(cfg.pretrained), "pretrained", "", start, None)
    if chosen is None:
        model = None
        why = ("no champion at registration" if baseline == "floor" else
               "eval.baseline=floor" if e.baseline == "floor" else "no champion registered")
        info = {"kind": "floor", "floor": e.floor, "note": why, "label": f"{e.floor} floor",
                "name": None, "uri": None, "version": None}
    else:
        model, _ = load_model(chosen.folder, device, chosen.weights_sha256)
        info = {"kind": chosen.kind, "label": f"pretrained {chosen.uri}" if chosen.kind == "pretrained" else
                f"{chosen.kind} models:/{chosen.name}/{chosen.version}",
                "name": chosen.name, "uri": chosen.uri, "version": chosen.version}
    sets, left_out = judged_sets(cfg, run_dir, packed, refresh, model is not None)
    scored = []
    for judged in sets:  # one loop: every set scored the same way
        mine = judged.packed or tk.pack_splits(judged.data.model_copy(update={"tokenizer": judged.data.tokenizer.model_copy(
            update={"path": str(packed / "tokenizer.json")})}), splits=("val",)).path
        cand = score(candidate, mine, "val", e.batch_size, e.max_batches, device)
        base = (floor(e.floor, mine, cand.sequences) if model is None else
                score(model, _baseline_packed(judged.data, mine, chosen.folder), "val", e.batch_size, e.max_batches,
                      device))
        scored.append((judged, cand, base))
    (_, cand, base), rest = scored[0], scored[1:]
    decision, paired = gate.decide(cand, base, info["label"], e.min_improvement, e.confidence,
                                   e.bootstrap_samples, e.seed)
    report = eval_report.build(cand, base, info, decision, _generations(cfg, candidate, packed, device),
                               str(folder.model))
    for judged, c, b in rest:
        if judged.role == "refresh":  # a refresh: judged on its held-out new data too
            fresh, _ = gate.decide(c, b, info["label"], e.min_improvement, e.confidence, e.bootstrap_samples, e.seed)
            passed, reason = gate.refresh_decision(decision, fresh, cfg.refresh.max_regression_bpb)
            report = eval_report.with_refresh(report, c, b, fresh, passed, reason, cfg.refresh.max_regression_bpb)
    if refresh is not None and model is not None:
        report = eval_report.with_forgetting(report, [
            {**j.info, "parent_bpb": b.bits_per_byte, "candidate_bpb": c.bits_per_byte}
            for j, c, b in rest if j.role == "forgetting"], left_out)
    if reported := [(j, c, b) for j, c, b in rest if j.role == "reported"]:
        report = eval_report.with_reported(report, [
            {"set": j.name, "baseline_bpb": b.bits_per_byte, "candidate_bpb": c.bits_per_byte} for j, c, b in reported])
    for name, data in eval_report.files(report, paired, decision).items():
        fsio.write_bytes(folder.eval / name, data)
    log.info("%s", report["reason"])
    return report


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
