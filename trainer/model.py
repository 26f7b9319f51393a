"""A GPT in one readable file (after nanoGPT), with document-aware attention for packed data.

When ``doc_ids`` are given, attention stays inside each document (block-diagonal causal mask,
``trainer/attention.py``) and positions restart at every document start, so packing never leaks
context across documents.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from trainer.attention import DocumentMask, attend


@dataclass(frozen=True)
class Shape:
    """What every model Taxiway trains is sized by (``trainer/arch.py`` names the architecture)."""

    vocab_size: int
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    block_size: int = 1024
    dropout: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class GPTConfig(Shape):
    """The GPT needs nothing beyond the shape: LayerNorm, learned positions, a 4x GELU MLP, tied embeddings."""


class KVCache:
    """Each layer's keys and values of the tokens seen so far, so generation feeds one new token a step
    instead of the whole sequence (``eval/generate.py``). Layers append in order."""

    def __init__(self, n_layer: int) -> None:
        self.kv: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * n_layer

    @property
    def length(self) -> int:
        return 0 if self.kv[0] is None else self.kv[0][0].shape[2]

    def extend(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, H, T, D) keys and values of ``layer`` with this step's appended; what attention reads."""
        past = self.kv[layer]
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        self.kv[layer] = (k, v)
        return k, v


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=False)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=False)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor, mask: DocumentMask | None, cache: KVCache | None = None,
                layer: int = 0) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if cache is not None:
            k, v = cache.extend(layer, k, v)
        y = attend(q, k, v, mask, self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd, bias=False)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.n_embd, bias=False)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=False), nn.GELU(),
            nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=False), nn.Dropout(cfg.dropout))

    def forward(self, x: torch.Tensor, mask: DocumentMask | None, cache: KVCache | None = None,
                layer: int = 0) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), mask, cache, layer)
        return x + self.mlp(self.ln2(x))


def document_positions(doc_ids: torch.Tensor) -> torch.Tensor:
    """Positions that restart at 0 where the document id changes."""
    T = doc_ids.shape[1]
    idx = torch.arange(T, device=doc_ids.device).expand_as(doc_ids)
    starts = torch.ones_like(doc_ids, dtype=torch.bool)
    starts[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    first = torch.where(starts, idx, torch.zeros_like(idx)).cummax(dim=1).values
    return idx - first


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=False)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied embeddings
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self, non_embedding: bool = True) -> int:
        n = sum(p.numel() for p in self.parameters())
        return n - self.wpe.weight.numel() if non_embedding else n

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None,
                doc_ids: torch.Tensor | None = None, reduction: str = "mean",
                cache: KVCache | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        B, T = idx.shape
        start = cache.length if cache is not None else 0
        if start + T > self.cfg.block_size:
            raise ValueError(f"sequence of {start + T} tokens exceeds block_size {self.cfg.block_size}")
        if doc_ids is None:
            pos, mask = torch.arange(start, start + T, device=idx.device)[None], None
        else:
            pos, mask = document_positions(doc_ids), DocumentMask(doc_ids)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for i, block in enumerate(self.blocks):
            x = block(x, mask, cache, i)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1), reduction=reduction)
        return logits, loss if reduction == "mean" else loss.view(B, T)
