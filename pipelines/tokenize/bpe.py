"""Byte-level BPE tokenizers (HF ``tokenizers``): train, load, and describe.

Byte-level means every character of a vocabulary entry stands for exactly one byte, so the
byte length of each token is known exactly; evaluation uses that for bits per byte.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from pipelines.config import TokenizerConfig
from pipelines.errors import BadInput


class TokenizerError(BadInput):
    """A tokenizer that cannot be used for this run."""


def train(texts: Iterable[str], cfg: TokenizerConfig, length: int | None = None):
    # tokenizers: DAG parse must not load it (tests/test_dag.py)
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=cfg.vocab_size, min_frequency=cfg.min_frequency,
        special_tokens=[cfg.eos_token], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False)
    tok.train_from_iterator(texts, trainer, length=length)
    tok.encode_special_tokens = True
    return tok


def load(path: str | Path, eos_token: str):
    from tokenizers import Tokenizer  # tokenizers: DAG parse must not load it (tests/test_dag.py)

    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises plain Exception subclasses
        # the library's message may quote the file: its kind only
        raise TokenizerError(f"{path}: not a tokenizer.json the tokenizers library loads ({type(exc).__name__})") from None
    if tok.token_to_id(eos_token) is None:
        raise TokenizerError(f"{path}: tokenizer has no token {eos_token!r} (tokenizer.eos_token)")
    tok.encode_special_tokens = True  # "<|endoftext|>" inside a document is text, never a boundary
    return tok


def token_bytes(tok) -> np.ndarray:
    """Bytes each token id stands for; special tokens (separators) count zero."""
    special = {t.content for t in tok.get_added_tokens_decoder().values()}
    vocab = tok.get_vocab()
    out = np.zeros(tok.get_vocab_size(), dtype=np.int32)
    for token, idx in vocab.items():
        out[idx] = 0 if token in special else len(token)
    return out

