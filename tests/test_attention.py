"""Document-masked attention (``trainer/attention.py``): the FlexAttention path a GPU runs gives the GPT and
the Llama model the logits and gradients of the dense-mask path (fp32, ≤ 1e-5) without touching the dense
mask, keeps each packed document to itself, and leaves attention dropout to the dense path. Run on CPU with
eager FlexAttention; the compiled CUDA kernel itself is not exercised here."""

from __future__ import annotations

import pytest
import torch
import torch.nn.attention.flex_attention as torch_flex

from trainer import attention
from trainer.attention import DocumentMask, attend
from trainer.llama import Llama, LlamaConfig
from trainer.model import GPT, GPTConfig

TOL = 1e-5
VOCAB, T = 61, 64
# Two rows as trainer/data.py packs them (ids count documents from each row's start): row 0 holds three
# documents, row 1 opens with the tail of a document begun before its window, and the same ids mark
# other spans in each row, so a mask that reads one row's ids for both is caught.
DOC_IDS = torch.tensor([[0] * 10 + [1] * 25 + [2] * 29,
                        [0] * 13 + [1] * 40 + [2] * 11])

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def _gpt() -> GPT:
    return GPT(GPTConfig(vocab_size=VOCAB, n_layer=2, n_head=4, n_embd=32, block_size=T))


def _llama() -> Llama:
    return Llama(LlamaConfig(vocab_size=VOCAB, n_layer=2, n_head=4, n_kv_head=2, n_embd=32, intermediate_size=64,
                             block_size=T))


MODELS = pytest.mark.parametrize("make", [_gpt, _llama], ids=["gpt", "llama"])


@pytest.fixture
def cpu_flex_backward(monkeypatch):
    """torch refuses FlexAttention's backward on CPU at its door, because its compiled CPU kernel has none; the
    eager path used here does have one, so the door is lifted to compare gradients."""
    monkeypatch.setattr(torch_flex, "_validate_device", lambda *tensors: None)


def _loss_and_grads(model: torch.nn.Module, idx: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad()
    logits, loss = model(idx, idx.roll(-1, dims=1), DOC_IDS)
    loss.backward()
    return logits.detach(), [p.grad.clone() for p in model.parameters()]


@MODELS
def test_flex_gives_the_dense_paths_logits_and_gradients_without_the_dense_mask(make, monkeypatch, cpu_flex_backward):
    torch.manual_seed(0)
    model, idx = make(), torch.randint(0, VOCAB, DOC_IDS.shape)
    monkeypatch.setattr(attention, "KIND", "dense")
    dense_logits, dense_grads = _loss_and_grads(model, idx)
    monkeypatch.setattr(attention, "KIND", "flex")
    monkeypatch.setattr(DocumentMask, "dense", property(lambda self: pytest.fail("the flex path built a dense mask")))
    flex_logits, flex_grads = _loss_and_grads(model, idx)
    assert (flex_logits - dense_logits).abs().max().item() <= TOL
    assert max((f - d).abs().max().item() for f, d in zip(flex_grads, dense_grads, strict=True)) <= TOL


@MODELS
def test_under_flex_a_document_never_sees_another(make, monkeypatch):
    torch.manual_seed(0)
    model, idx = make().eval(), torch.randint(0, VOCAB, DOC_IDS.shape)
    changed = idx.clone()
    changed[0, 10:35] = (changed[0, 10:35] + 1) % VOCAB  # row 0's middle document, with one on either side
    monkeypatch.setattr(attention, "KIND", "flex")
    with torch.no_grad():
        before, _ = model(idx, doc_ids=DOC_IDS)
        after, _ = model(changed, doc_ids=DOC_IDS)
    others = torch.ones_like(DOC_IDS, dtype=torch.bool)
    others[0, 10:35] = False
    assert (after[others] - before[others]).abs().max().item() <= TOL
    assert (after[0, 10:35] - before[0, 10:35]).abs().max().item() > 1e-3  # the change itself shows


def test_attention_dropout_takes_the_dense_path_and_auto_is_dense_on_cpu():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, T, 8) for _ in range(3))
    torch.manual_seed(1)
    flex = attend(q, k, v, DocumentMask(DOC_IDS, "flex"), dropout=0.5)
    torch.manual_seed(1)
    dense = attend(q, k, v, DocumentMask(DOC_IDS, "dense"), dropout=0.5)
    assert torch.equal(flex, dense)
    assert not DocumentMask(DOC_IDS).flex
