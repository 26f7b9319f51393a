"""Evaluation: scores, the unigram floor, the paired bootstrap gate, reports, generations, bad model files.

Real packed data (the tiny config's corpus), real models trained for a few hundred steps in
this process, the real ``taxiway`` CLI for the exit codes.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from trained_models import make_run

from conftest import cli


@pytest.fixture(scope="module")
def strong(session_home: Path, demo_data) -> Path:
    return make_run(session_home, "eval-strong", 300, ["name=eval-strong", "eval.floor=unigram", "eval.baseline=floor"])


@pytest.fixture(scope="module")
def weak(session_home: Path, demo_data) -> Path:
    return make_run(session_home, "eval-weak", 5, ["name=eval-weak", "eval.floor=unigram", "eval.baseline=floor"])


def _cfg(run_dir: Path):
    from pipelines.stages.prepare import load_run_config

    return load_run_config(run_dir)


def _packed(run_dir: Path) -> Path:
    return Path(json.loads((run_dir / "tokenize" / "packed.json").read_text())["path"])


def _model(run_dir: Path):
    from eval.model_files import load_model

    return load_model(run_dir / "model")[0]


def test_score_is_deterministic_and_its_totals_agree(strong: Path):
    from eval.score import LN2, score

    packed, model = _packed(strong), _model(strong)
    a = score(model, packed, "val", 16, 8)
    b = score(model, packed, "val", 16, 8)
    assert a.summary() == b.summary() and np.array_equal(a.seq_bits, b.seq_bits)
    other_batching = score(model, packed, "val", 5, 128 // 5 + 1)  # 130 windows, other batch shapes
    assert np.allclose(other_batching.seq_bits[:128], a.seq_bits, rtol=1e-5)

    assert a.sequences == 128 and a.tokens == 128 * 32 and len(a.seq_bits) == 128
    assert a.bits_per_byte == pytest.approx(a.seq_bits.sum() / a.seq_bytes.sum())
    assert a.loss == pytest.approx(a.seq_bits.sum() * LN2 / a.tokens)
    assert a.perplexity == pytest.approx(math.exp(a.loss))
    # every predicted token is attributed to exactly one document
    assert a.doc_bits.sum() == pytest.approx(a.seq_bits.sum()) and a.doc_bytes.sum() == a.seq_bytes.sum()
    assert 0 < a.complete_docs < len(a.doc_bits)  # truncated by max_batches: the last document is partial


def test_unigram_floor_is_the_entropy_of_the_scored_tokens(strong: Path):
    from eval.floor import floor
    from trainer.data import PackedSplit

    packed = _packed(strong)
    _, y, _ = PackedSplit(packed, "val").batch(np.arange(128))
    token_bytes = np.load(packed / "token_bytes.npy")
    p = np.bincount(y.ravel()) / y.size
    entropy = -(p[p > 0] * np.log2(p[p > 0])).sum()
    nbytes = token_bytes[y].sum()

    unigram = floor("unigram", packed, 128)
    assert unigram.bits_per_byte == pytest.approx(entropy * y.size / nbytes)
    assert unigram.loss == pytest.approx(entropy * math.log(2))
    uniform = floor("uniform", packed, 128)
    assert uniform.bits_per_byte == pytest.approx(math.log2(len(token_bytes)) * y.size / nbytes)
    assert uniform.bits_per_byte > unigram.bits_per_byte
    with pytest.raises(ValueError, match="eval.floor"):
        floor("bigram", packed, 128)


def _paired(diff: float, n: int = 400, noise: float = 0.3, seed: int = 1):
    from eval.stats import Paired

    rng = np.random.default_rng(seed)
    nbytes = rng.integers(50, 150, n)
    base = rng.uniform(2, 5, n) * nbytes
    cand = base - diff * nbytes + rng.normal(0, noise, n) * nbytes
    return Paired("sequence", cand, nbytes, base, nbytes)


def test_paired_bootstrap_bounds_and_determinism():
    from eval.stats import paired_bootstrap

    p = _paired(0.05)
    a = paired_bootstrap(p, 0.95, 2000, seed=0)
    assert a == paired_bootstrap(p, 0.95, 2000, seed=0)
    assert a != paired_bootstrap(p, 0.95, 2000, seed=1)
    assert a.point == pytest.approx(p.base_bits.sum() / p.base_bytes.sum() - p.cand_bits.sum() / p.cand_bytes.sum())
    assert a.lower < a.point < a.upper and a.lower > 0  # 0.05 with 0.3 noise over 400 units: significant
    # the bound widens with confidence and with noise, and tightens with more units
    assert paired_bootstrap(p, 0.99, 2000, 0).lower < a.lower
    assert paired_bootstrap(_paired(0.05, noise=1.0), 0.95, 2000, 0).lower < a.lower
    wide = paired_bootstrap(_paired(0.05, n=50), 0.95, 2000, 0)
    assert wide.upper - wide.lower > a.upper - a.lower
    # the standard error of a mean difference: the bootstrap's one-sided 95% bound sits ~1.645 SE below
    d = p.base_bpb - p.cand_bpb
    assert a.point - a.lower == pytest.approx(1.645 * d.std() / math.sqrt(len(d)), rel=0.25)


def test_gate_decisions():
    from eval.gate import decide
    from eval.score import Score

    def score_of(p, who: str) -> Score:
        bits, nbytes = (p.cand_bits, p.cand_bytes) if who == "c" else (p.base_bits, p.base_bytes)
        return Score("same", "tok", 1.0, bits.sum() / nbytes.sum(), 2.7, 1, int(nbytes.sum()), len(bits),
                     bits, nbytes, bits, nbytes, len(bits))

    better, tie = _paired(0.05), _paired(0.0, noise=0.0)
    passed, _ = decide(score_of(better, "c"), score_of(better, "b"), "champion models:/m/1", 0.0, 0.95, 1000, 0)
    assert passed.passed and "beats champion models:/m/1" in passed.reason and "lower bound" in passed.reason
    too_little, _ = decide(score_of(better, "c"), score_of(better, "b"), "b", 0.2, 0.95, 1000, 0)
    assert not too_little.passed and "< required +0.2000" in too_little.reason
    same, _ = decide(score_of(tie, "c"), score_of(tie, "b"), "b", 0.0, 0.95, 1000, 0)
    assert same.interval.lower == 0 and not same.passed and "not significant" in same.reason
    worse, _ = decide(score_of(better, "b"), score_of(better, "c"), "b", 0.0, 0.95, 1000, 0)
    assert not worse.passed and worse.improvement_bpb < 0


def test_documents_pair_models_with_different_tokenizers(strong: Path, home: Path):
    """The same val text packed by two tokenizers: windows differ, documents line up."""
    from eval.score import score
    from eval.stats import pair
    from trainer.model import GPT, GPTConfig

    other = make_run(home, "eval-vocab300", 0, ["name=eval-vocab300", "tokenizer.vocab_size=300"])
    a_packed, b_packed = _packed(strong), _packed(other)
    assert a_packed != b_packed
    a = score(_model(strong), a_packed, "val", 16, None)
    b = score(GPT(GPTConfig(vocab_size=300, n_layer=1, n_head=1, n_embd=16, block_size=64)), b_packed, "val", 16, None)
    documents = json.loads((a_packed / "manifest.json").read_text())["splits"]["val"]["documents"]
    assert a.complete_docs == len(a.doc_bits) == documents  # the whole split: every document complete
    p = pair(a, b)
    assert p.unit == "document" and len(p) == a.complete_docs == b.complete_docs > 1
    # each document's bytes agree up to the few tokens that start a window and are never predicted
    assert np.allclose(p.cand_bytes, p.base_bytes, rtol=0.15)
    truncated = score(_model(strong), a_packed, "val", 16, 8)
    assert len(pair(truncated, b)) == truncated.complete_docs < a.complete_docs
    inside_first_document = score(_model(strong), a_packed, "val", 16, 4)
    with pytest.raises(ValueError, match="share no fully scored validation document"):
        pair(inside_first_document, b)


def test_evaluate_stage_passes_a_good_model_and_fails_a_weak_one(strong: Path, weak: Path):
    from pipelines import stages

    good = stages.evaluate.run(_cfg(strong), strong)
    assert good["passed"] and good["baseline"]["kind"] == "floor" and good["baseline"]["floor"] == "unigram"
    assert good["gate"]["lower_bpb"] > 0 and good["gate"]["unit"] == "sequence" and good["gate"]["units"] == 128
    assert good["summary"].startswith("No baseline (eval.baseline=floor): compared against the unigram floor")
    bad = stages.evaluate.run(_cfg(weak), weak)
    assert not bad["passed"] and bad["improvement_bpb"] < 0 and "does not beat unigram floor" in bad["reason"]

    folder = strong / "eval"
    assert {p.name for p in folder.iterdir()} >= {"report.json", "report.md", "comparison.png", "per_unit.csv"}
    assert (folder / "comparison.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = (folder / "per_unit.csv").read_text().splitlines()
    assert rows[0].startswith("sequence,") and len(rows) == 129
    md = (folder / "report.md").read_text()
    assert "# Evaluation: PASSED" in md and "## Generations" in md and "Prompt ` def  `" in md  # a code span, padded: CommonMark shows "def "
    assert re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md) == ["comparison.png"]  # shown, relative to the report
    gens = good["generations"]
    assert [g["prompt"] for g in gens] == ["def ", "import ", "class "]
    assert all(g["text"].startswith(g["prompt"]) and len(g["text"]) > len(g["prompt"]) for g in gens)

    again = stages.evaluate.run(_cfg(strong), strong)  # deterministic, generations included
    assert {k: v for k, v in again.items() if k != "created_at"} == {k: v for k, v in good.items() if k != "created_at"}


def test_the_runs_own_sets_are_reported_beside_the_gate_and_never_decide(weak: Path, demo_data: Path, tmp_path: Path):
    """``eval.report_sets`` (a trigger's): scored in the same loop as the gate's set, shown beside it;
    the decision is the gate set's alone, even where the candidate wins on a set of the run's own."""
    from pipelines import stages

    run = shutil.copytree(weak, tmp_path / "run")
    cfg = _cfg(run)
    plain = stages.evaluate.run(cfg, run)
    sets = [cfg.data.val, cfg.data.train]
    rep = stages.evaluate.run(cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"report_sets": sets})}), run)
    assert {k: rep[k] for k in ("passed", "reason", "gate")} == {k: plain[k] for k in ("passed", "reason", "gate")}
    assert not rep["passed"] and [r["set"] for r in rep["reported"]] == sets
    same = rep["reported"][0]  # the gate's own folder, scored as a reported set: the same figures
    assert math.isclose(same["candidate_bpb"], rep["candidate"]["bits_per_byte"], rel_tol=1e-9)
    assert math.isclose(same["baseline_bpb"], rep["baseline"]["bits_per_byte"], rel_tol=1e-9)
    md = (run / "eval" / "report.md").read_text()
    assert "## The run's own sets" in md and "never deciding a promotion" in md
    assert "reported" not in plain


def test_generation_is_seeded(strong: Path):
    from eval.generate import complete
    from pipelines.tokenize import bpe

    model, tok = _model(strong), bpe.load(strong / "model" / "tokenizer.json", "<|endoftext|>")
    runs = {seed: complete(model, tok, "import ", 24, 1.0, None, seed) for seed in (0, 0, 1, 2)}
    assert complete(model, tok, "import ", 24, 1.0, None, 0) == runs[0]
    assert len(set(runs.values())) > 1
    greedy = complete(model, tok, "import ", 24, 0.0, None, 5)
    assert greedy == complete(model, tok, "import ", 24, 0.0, None, 6)
    with pytest.raises(ValueError, match="non-empty prompt"):
        complete(model, tok, "", 4)


def test_the_kv_cache_gives_the_tokens_the_whole_window_gives_past_block_size_too(strong: Path):
    """Greedy and seeded sampling read the same with the cache as without it; a prompt close to
    ``block_size`` runs past it, where the window slides and the cache steps aside."""
    from eval.generate import sample

    model = _model(strong)
    block = model.cfg.block_size
    for prompt in ([5, 9, 2], list(range(1, block - 3))):
        for temperature, seed in ((0.0, 0), (1.0, 3)):
            cached = sample(model, prompt, 12, temperature, None, seed)
            assert cached == sample(model, prompt, 12, temperature, None, seed, cache=False), (len(prompt), temperature)


def _broken_copy(src: Path, dest: Path) -> Path:
    shutil.copytree(src / "model", dest)
    return dest


def test_bad_model_files_are_named(strong: Path, tmp_path: Path):
    import torch
    from safetensors.torch import load_file, save_file

    from eval.model_files import ModelFileError, load_model

    with pytest.raises(ModelFileError, match=r"nothing/model\.json: missing"):
        load_model(tmp_path / "nothing")
    truncated = _broken_copy(strong, tmp_path / "truncated")
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(ModelFileError, match=rf"{weights}: unreadable weights"):
        load_model(truncated)
    garbled = _broken_copy(strong, tmp_path / "garbled")
    (garbled / "model.json").write_text("{not json")
    with pytest.raises(ModelFileError, match=r"model\.json: not a model description"):
        load_model(garbled)
    nan = _broken_copy(strong, tmp_path / "nan")
    state = load_file(nan / "model.safetensors")
    state["model.embed_tokens.weight"][0, 0] = float("nan")
    save_file(state, nan / "model.safetensors")
    with pytest.raises(ModelFileError, match="embed_tokens.weight holds NaN"):
        load_model(nan)
    with pytest.raises(ModelFileError, match="differs from the recorded"):
        load_model(strong / "model", sha256="0" * 64)
    shape = _broken_copy(strong, tmp_path / "shape")
    spec = json.loads((shape / "model.json").read_text())
    spec["config"]["n_embd"] = 64
    (shape / "model.json").write_text(json.dumps(spec))
    with pytest.raises(ModelFileError):
        load_model(shape)
    spec["config"]["arch"] = "mamba"
    (shape / "model.json").write_text(json.dumps(spec))
    with pytest.raises(ModelFileError, match=r"shape/model\.json: arch 'mamba' is not one Taxiway trains"):
        load_model(shape)
    assert torch.isfinite(load_model(strong / "model")[0].lm_head.weight).all()


def test_cli_evaluate_exit_codes(strong: Path, weak: Path, tmp_path: Path):
    """A gate that fails exits 1, unreadable weights exit 2 (exit 0: ``taxiway run``, tests/test_cli.py)."""
    gate = cli("evaluate", "-c", str(weak / "config.yaml"), "--run-dir", str(weak))
    assert gate.returncode == 1 and "does not beat" in gate.stdout

    broken = tmp_path / "broken"
    shutil.copytree(strong, broken)
    shutil.rmtree(broken / "eval", ignore_errors=True)  # a report only if another test evaluated it first
    (broken / "model" / "model.safetensors").write_bytes(b"\x00" * 16)
    bad = cli("evaluate", "-c", str(broken / "config.yaml"), "--run-dir", str(broken))
    assert bad.returncode == 2, bad.stderr
    assert f"error: {broken / 'model' / 'model.safetensors'}: unreadable weights" in bad.stderr
    assert not (broken / "eval" / "report.json").exists(), "no report for a model that could not be read"


def test_prefetch_hands_over_reader_errors_and_stops_with_its_consumer():
    import threading

    from eval.score import _prefetched

    def failing():
        yield 1
        raise OSError("shard unreadable")

    with pytest.raises(OSError, match="shard unreadable"):
        list(_prefetched(failing()))
    endless = _prefetched(iter(range(10**9)))
    assert next(endless) == 0
    endless.close()  # the consumer stops early: the reader thread must end too
    for thread in [t for t in threading.enumerate() if t.name == "eval-prefetch"]:
        thread.join(timeout=60)  # bounds a hang only
    assert not any(t.name == "eval-prefetch" for t in threading.enumerate())
