"""Start from a Hugging Face checkpoint (``pretrained``): a folder ``transformers`` wrote
(``save_pretrained`` of a small random Llama, beside a tokenizer of the corpus) is fetched and checked
when the run is prepared, its tokenizer packs the data (no BPE training), training starts from its
weights, and the gate compares against it while no champion exists; a folder Taxiway cannot start
from is refused before any compute, naming the file and what was expected, and leaves nothing behind.
(Loading and serving what was registered: tests/test_registry_server.py.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from trained_models import make_run

from conftest import TINY, cli
from trainer.fsio import sha256_file


def _hf_folder(dest: Path, tokenizer: Path, vocab: int, **config) -> Path:
    import torch
    import transformers

    torch.manual_seed(0)
    shape = {"vocab_size": vocab, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
             "tie_word_embeddings": False, **config}
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**shape)).save_pretrained(dest)
    shutil.copyfile(tokenizer, dest / "tokenizer.json")
    return dest


@pytest.fixture
def corpus_tokenizer(home: Path, demo_data) -> tuple[Path, int]:
    """The tiny corpus's tokenizer (a one-step Taxiway run's export) and its number of tokens."""
    from tokenizers import Tokenizer

    tok = make_run(home, "tokenizer-source", 1) / "model" / "tokenizer.json"
    return tok, Tokenizer.from_file(str(tok)).get_vocab_size(with_added_tokens=True)


def test_a_run_starts_from_a_transformers_checkpoint_and_must_beat_it(home: Path, corpus_tokenizer):
    tok, vocab = corpus_tokenizer
    start = _hf_folder(home / "data" / "hf-start", tok, vocab + 3)  # an embedding padded past the tokenizer
    run = cli("run", "-c", str(TINY), "--set", f"pretrained={start}", "--set", "registry.model_name=from-hf")
    assert run.returncode == 0, run.stdout + run.stderr
    run_dir = Path(run.stdout.strip().splitlines()[-1]).parent

    from pipelines.registry import client, lineage

    packed = lineage.packed_info(run_dir)["manifest"]
    assert packed["tokenizer_sha256"] == sha256_file(start / "tokenizer.json")  # its tokenizer, none trained
    model = json.loads((run_dir / "train" / "spec.json").read_text())["model"]
    assert (model["arch"], model["vocab_size"], model["n_embd"], model["n_kv_head"], model["tie_embeddings"]) == \
        ("llama", vocab + 3, 32, 2, False)  # the checkpoint's shape, not the config's model.*
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    (loaded,) = [e for e in events if e["event"] == "parent_loaded"]
    assert loaded["uri"] == str(start) and loaded["global_step"] == 0

    from pipelines.config import limits
    from pipelines.stages import prepare, pretrained

    cfg = prepare.load_run_config(run_dir)  # the disk estimate holds the folder's (untied) model, not model.*
    assert limits.checkpoint_bytes(pretrained.effective(cfg, run_dir)) > limits.checkpoint_bytes(cfg)

    report = json.loads((run_dir / "eval" / "report.json").read_text())
    assert report["baseline"]["kind"] == "pretrained" and report["passed"], report["reason"]
    champion = client().get_model_version_by_alias("from-hf", "champion")
    assert champion.tags["taxiway.pretrained"].startswith(f"{start} (weights sha256 ")
    assert champion.tags["taxiway.replaced_champion"] == "none (pretrained)"  # it beat the start, not the floor


@pytest.mark.parametrize("broken", ["no tokenizer", "gpt2", "tokenizer past the embedding", "shapes", "eos", "limits",
                                    "index leaves the folder"])
def test_a_folder_it_cannot_start_from_is_refused_at_prepare_naming_the_file(home: Path, corpus_tokenizer,
                                                                             broken: str):
    from pipelines import stages
    from pipelines.config import load_config
    from pipelines.errors import BadInput

    tok, vocab = corpus_tokenizer
    folder = _hf_folder(home / "data" / "hf", tok, vocab - 10 if broken == "tokenizer past the embedding" else vocab)
    overrides = [f"pretrained={folder}"]
    expected = {
        "no tokenizer": r"missing tokenizer\.json; a Hugging Face model folder holds",
        "gpt2": r"pretrained config\.json: architectures: expected \['LlamaForCausalLM'\] \(model_type 'llama'\), this "
                r"folder holds another model",
        "tokenizer past the embedding": rf"pretrained tokenizer\.json: {vocab:,} tokens, but config\.json vocab_size "
                                        rf"is {vocab - 10:,}: ids past the embedding have no row",
        "shapes": rf"pretrained model\.safetensors: model\.embed_tokens\.weight is \[{vocab}, 32\], expected "
                  rf"\({vocab}, 64\) from config\.json",
        "eos": r"tokenizer\.json: tokenizer has no token '</s>' \(tokenizer\.eos_token\)",
        # the tiny config's own model (43,168 parameters) fits; the folder's untied one does not
        "index leaves the folder": r"pretrained model\.safetensors\.index\.json: expected a weight_map of tensor "
                                   r"names to \.safetensors files in the folder",
        "limits": r"pretrained config\.json: the model .* has [\d,]+ parameters, over limits\.parameters \(45,000\)",
    }[broken]
    config = json.loads((folder / "config.json").read_text())
    if broken == "no tokenizer":
        (folder / "tokenizer.json").unlink()
    elif broken == "gpt2":
        (folder / "config.json").write_text(json.dumps({**config, "architectures": ["GPT2LMHeadModel"],
                                                        "model_type": "gpt2"}))
    elif broken == "shapes":
        (folder / "config.json").write_text(json.dumps({**config, "hidden_size": 64, "head_dim": 16}))
    elif broken == "eos":
        overrides.append("tokenizer.eos_token=</s>")
    elif broken == "index leaves the folder":  # a shard named outside the folder is never copied
        (folder / "model.safetensors").rename(home / "data" / "outside.safetensors")
        (folder / "model.safetensors.index.json").write_text(json.dumps(
            {"weight_map": {"model.embed_tokens.weight": "../outside.safetensors"}}))
    elif broken == "limits":
        overrides.append("limits.parameters=45000")
    run_dir = home / "runs" / "refused"
    with pytest.raises(BadInput, match=expected):
        stages.prepare.prepare(load_config(TINY, overrides), run_dir)
    assert not (run_dir / "pretrained").exists() and not list(run_dir.glob(".pretrained.*"))


def test_a_refresh_continues_the_champion_not_the_pretrained_start(tmp_path: Path):
    """A deployment that starts from ``pretrained`` refreshes its champion: the refresh's config drops the
    pretrained folder (else the run would start from it again and fetch it for nothing)."""
    from pipelines.config import load_config
    from pipelines.refresh.plan import refresh_config

    cfg = load_config(TINY, [f"pretrained={tmp_path}"])
    refresh = refresh_config(cfg, tmp_path, "models:/m/1")
    assert (refresh.parent, refresh.pretrained) == ("models:/m/1", None)


def test_a_pretrained_folder_is_held_to_the_data_roots(home: Path, tmp_path: Path, demo_data):
    from pipelines.config import load_config
    from pipelines.roots import OutOfBounds, Roots, data_values

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    with pytest.raises(OutOfBounds, match=r"pretrained: '.*elsewhere' is outside the data roots"):
        Roots.from_env().check_data(data_values(load_config(TINY, [f"pretrained={outside}"])))
    with pytest.raises(ValueError, match="a run starts from one model"):
        load_config(TINY, [f"pretrained={outside}", "parent=models:/x/1"])
