"""Text from a model for a human to read: seeded sampling, so the same prompt reads the same.

A private ``torch.Generator`` per call keeps sampling independent of (and from disturbing) the
global RNG. Generation stops at the end-of-document token.
"""

from __future__ import annotations

from typing import Protocol

import torch

from trainer.model import GPT


class Tokenizer(Protocol):
    """What generation needs of a ``tokenizers.Tokenizer``."""

    def encode(self, text: str): ...
    def decode(self, ids: list[int]) -> str: ...


@torch.inference_mode()
def sample(model: GPT, prompt_ids: list[int], max_new_tokens: int, temperature: float = 0.8,
           top_k: int | None = 40, seed: int = 0, eos_id: int | None = None, device: str = "cpu") -> list[int]:
    """New token ids after ``prompt_ids``; ``temperature`` 0 is greedy."""
    if not prompt_ids:
        raise ValueError("prompt encodes to no tokens; give a non-empty prompt")
    model.eval().to(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    idx = torch.tensor([prompt_ids], dtype=torch.long, device=device)
    out: list[int] = []
    for _ in range(max_new_tokens):
        logits, _ = model(idx[:, -model.cfg.block_size:])
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
        idx = torch.cat([idx, torch.tensor([[nxt]], device=device)], dim=1)
    return out


def complete(model: GPT, tokenizer: Tokenizer, prompt: str, max_new_tokens: int, temperature: float = 0.8,
             top_k: int | None = 40, seed: int = 0, eos_id: int | None = None, device: str = "cpu") -> str:
    """The prompt followed by the model's continuation, as text."""
    ids = tokenizer.encode(prompt).ids
    new = sample(model, ids, max_new_tokens, temperature, top_k, seed, eos_id, device)
    return tokenizer.decode(ids + new)
