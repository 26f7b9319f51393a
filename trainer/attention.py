"""Attention for packed data: causal, and no token sees another document's.

A model's forward builds one ``DocumentMask`` from its (B, T) document ids and every layer hands it to
``attend``. On CUDA it is a FlexAttention ``BlockMask`` read from the ids block by block, so no (T, T)
mask is ever built and the fused kernel skips the blocks two documents never share; on CPU it is the
dense boolean mask through ``scaled_dot_product_attention``, the fallback that runs everywhere.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

Kind = Literal["auto", "flex", "dense"]
KIND: Kind = "auto"  # auto: flex on CUDA, dense elsewhere; "flex" or "dense" forces one (tests compare them on CPU)


@functools.cache
def _compiled() -> tuple[Callable[..., torch.Tensor], Callable[..., BlockMask]]:
    """FlexAttention and its block-mask builder compiled once per process (uncompiled, both materialize the
    dense mask they exist to avoid). Compiled on first use, not at import: ``torch.compile`` loads dynamo,
    3 s more for every process that imports a model (bench/ and eval/ on CPU included)."""
    return torch.compile(flex_attention), torch.compile(create_block_mask)


class DocumentMask:
    """Who may attend to whom in a packed batch: each query sees the keys at or before it in its own
    document. Built once per forward; each form is made on first use and shared by every layer."""

    def __init__(self, doc_ids: torch.Tensor, kind: Kind | None = None) -> None:
        kind = kind or KIND
        self.doc_ids = doc_ids
        self.flex = kind == "flex" or (kind == "auto" and doc_ids.is_cuda)

    @functools.cached_property
    def dense(self) -> torch.Tensor:
        """(B, 1, T, T) boolean: causal and same document."""
        T = self.doc_ids.shape[1]
        causal = torch.ones(T, T, dtype=torch.bool, device=self.doc_ids.device).tril()
        same = self.doc_ids[:, :, None] == self.doc_ids[:, None, :]
        return (same & causal)[:, None]

    @functools.cached_property
    def block(self) -> BlockMask:
        """The same mask as FlexAttention's block-sparse ``BlockMask`` (one for all heads)."""
        doc_ids = self.doc_ids

        def same_document(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
            return (q_idx >= kv_idx) & (doc_ids[b, q_idx] == doc_ids[b, kv_idx])

        B, T = doc_ids.shape
        build = _compiled()[1] if doc_ids.is_cuda else create_block_mask
        return build(same_document, B, None, T, T, device=doc_ids.device)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: DocumentMask | None, dropout: float) -> torch.Tensor:
    """Causal attention, inside documents when ``mask`` is given; with a cache (``mask`` None), the new
    queries are the last of ``k``'s positions (one new token sees every cached one, a prefill is causal
    from position 0)."""
    if mask is not None:
        if mask.flex and not dropout:
            return (_compiled()[0] if q.is_cuda else flex_attention)(q, k, v, block_mask=mask.block)
        # FlexAttention has no dropout: a forward with attention dropout takes the dense mask, as on CPU
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.dense, dropout_p=dropout)
    if q.shape[2] == 1:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout)
    if q.shape[2] != k.shape[2]:
        raise ValueError("a cached step feeds one token, or the whole prompt into an empty cache")
    return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
