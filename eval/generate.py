"""Text from a model for a human to read: seeded sampling, so the same prompt reads the same.

A private ``torch.Generator`` per call keeps sampling independent of (and from disturbing) the
global RNG. Generation stops at the end-of-document token. A KV cache (``trainer.model.KVCache``)
feeds one new token a step while the sequence fits ``block_size``; past it the window slides and the
positions restart, so each step is computed whole, as without the cache.
"""

from __future__ import annotations

from typing import Protocol

import torch

from trainer.arch import CausalLM
from trainer.model import KVCache


class Tokenizer(Protocol):
    """What generation needs of a ``tokenizers.Tokenizer``."""

    def encode(self, text: str): ...
    def decode(self, ids: list[int]) -> str: ...


@torch.inference_mode()
def sample(model: CausalLM, prompt_ids: list[int], max_new_tokens: int, temperature: float = 0.8,
           top_k: int | None = 40, seed: int = 0, eos_id: int | None = None, device: str = "cpu",
           cache: bool = True) -> list[int]:
    """New token ids after ``prompt_ids``; ``temperature`` 0 is greedy; ``cache`` False recomputes the
    whole window every step (the reference the cache is measured and tested against)."""
    if not prompt_ids:
        raise ValueError("prompt encodes to no tokens; give a non-empty prompt")
    model.eval().to(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    block = model.cfg.block_size
    ids, out = list(prompt_ids), []
    kv, feed = (KVCache(model.cfg.n_layer) if cache else None), ids[-block:]
    for _ in range(max_new_tokens):
        if kv is not None and kv.length + len(feed) <= block:
            logits, _ = model(torch.tensor([feed], device=device), cache=kv)
        else:  # no cache, or past block_size: the whole window, its positions from 0
            kv = None
            logits, _ = model(torch.tensor([ids[-block:]], device=device))
        logits = logits[0, -1].float()
        if temperature <= 0:
            nxt = int(logits.argmax())
        else:
            logits = logits / temperature
            if top_k:
                kth = torch.topk(logits, min(top_k, logits.numel())).values[-1]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            nxt = int(torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=gen))
        if nxt == eos_id:
            break
        out.append(nxt)
        ids.append(nxt)
        feed = [nxt]
    return out


def complete(model: CausalLM, tokenizer: Tokenizer, prompt: str, max_new_tokens: int, temperature: float = 0.8,
             top_k: int | None = 40, seed: int = 0, eos_id: int | None = None, device: str = "cpu") -> str:
    """The prompt followed by the model's continuation, as text."""
    ids = tokenizer.encode(prompt).ids
    new = sample(model, ids, max_new_tokens, temperature, top_k, seed, eos_id, device)
    return tokenizer.decode(ids + new)
