"""Oracle: the tiktoken engine the tokenize stage encodes with gives HF ``tokenizers``' own ids at
the vocabulary sizes users run (4096: the demo; 32768: a common production size), not only at the
300-token BPE of ``test_tokenize.py``.

Both BPEs are trained once for the module, the way the stage trains them (``bpe.train``), on the
demo generator's train split; the demo corpus reaches 32768 tokens (the test asserts the size
really reached). Held-out demo documents (val split) and random texts (unicode, long runs,
whitespace, special-token text) are encoded by both engines.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.config import TokenizerConfig
from pipelines.demo_data import write_demo_data
from pipelines.tokenize import bpe
from pipelines.tokenize.engine import batch_encoder

SIZES = (4096, 32768)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("oracle") / "demo"
    write_demo_data(out, seed=0)
    return out


@pytest.fixture(scope="module")
def tokenizers(demo: Path) -> dict[int, tuple]:
    """vocab size -> (HF tokenizer as the stage loads it, the stage's batch encoder)."""
    texts = [p.read_text() for p in sorted((demo / "train").iterdir())]
    out = {}
    for size in SIZES:
        path = demo.parent / f"bpe-{size}.json"
        bpe.train(texts, TokenizerConfig(vocab_size=size)).save(str(path))
        tok = bpe.load(path, "<|endoftext|>")
        out[size] = (tok, batch_encoder(tok, path))
    return out


def _hf(tok, texts: list[str]) -> list[list[int]]:
    return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]


@pytest.mark.parametrize("size", SIZES)
def test_the_size_users_run_is_reached_and_encoded_by_tiktoken(tokenizers: dict, size: int):
    tok, encode = tokenizers[size]
    assert tok.get_vocab_size() == size
    assert encode.__name__ == "tiktoken_bpe", "a plain byte-level BPE must take the tiktoken engine"


@pytest.mark.parametrize("size", SIZES)
def test_held_out_demo_documents(tokenizers: dict, demo: Path, size: int):
    tok, encode = tokenizers[size]
    texts = [p.read_text() for p in sorted((demo / "val").iterdir())]
    got, want = encode(texts), _hf(tok, texts)
    differing = [i for i, (g, w) in enumerate(zip(got, want, strict=True)) if g != w]
    assert not differing, f"{len(differing)} of {len(texts)} documents differ"
    assert sum(map(len, want)) > 100_000
    # long merged tokens of the big vocabulary are used, so merge order matters here
    assert max(len(tok.id_to_token(i)) for doc in want for i in doc) >= 8


_TEXTS = st.lists(
    st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=200)
    | st.lists(st.sampled_from(["'s", "'ll", "'Re", " ", "  ", "\n", "\n\n", "\t", "\r\n", "<|endoftext|>", "def",
                                " return", "self", "_", "__init__", "a" * 40, "é", "中文", "🙂", "\u0301", "\u00a0",
                                "0", "123456", "-", ".", "#", "    "]),
               max_size=80).map("".join),
    min_size=1, max_size=16)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(texts=_TEXTS)
def test_random_texts(tokenizers: dict, texts: list[str]):
    for tok, encode in tokenizers.values():
        assert encode(texts) == _hf(tok, texts)
