"""What makes a Llama export a Hugging Face model folder that ``AutoModelForCausalLM``, ``AutoTokenizer``
and MLflow's transformers flavor load as it is: the tokenizer's own config beside ``tokenizer.json``,
and the document separator as end-of-sequence in ``config.json`` and ``generation_config.json``, so a
server stops where Taxiway's own generation stops. A GPT export has no ``config.json``: Taxiway's
format only."""

from __future__ import annotations

import json
from pathlib import Path

from trainer import fsio

TOKENIZER_CLASS = "PreTrainedTokenizerFast"  # reads tokenizer.json as it is: no slow tokenizer, no download


def is_hf(model_dir: Path) -> bool:
    return (model_dir / "config.json").is_file()


def complete(model_dir: Path, eos_token: str) -> None:
    """Write the Hugging Face files that name the tokenizer and the end of a document (idempotent)."""
    if not is_hf(model_dir):
        return
    from tokenizers import Tokenizer  # tokenizers: DAG parse must not load it (tests/test_dag.py)

    eos = Tokenizer.from_file(str(model_dir / "tokenizer.json")).token_to_id(eos_token)
    if eos is None:  # an added token or one of the model's vocabulary, as a pretrained tokenizer may have it
        raise ValueError(f"{model_dir / 'tokenizer.json'}: no token {eos_token!r} (tokenizer.eos_token)")
    config = json.loads((model_dir / "config.json").read_text())
    fsio.write_json(model_dir / "config.json", {**config, "eos_token_id": eos, "pad_token_id": eos})
    fsio.write_json(model_dir / "generation_config.json", {"eos_token_id": eos, "pad_token_id": eos})
    fsio.write_json(model_dir / "tokenizer_config.json", {
        "tokenizer_class": TOKENIZER_CLASS, "eos_token": eos_token, "pad_token": eos_token,
        "model_max_length": config["max_position_embeddings"], "clean_up_tokenization_spaces": False})
