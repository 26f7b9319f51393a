"""Score a model on a packed split: loss per token and bits per byte.

Bits per byte divides the summed negative log-likelihood (in bits) by the bytes of text the
predicted tokens stand for, so models with different tokenizers compare fairly.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from trainer.data import PackedSplit
from trainer.model import GPT


@dataclass
class Score:
    loss: float              # mean nats per predicted token
    bits_per_byte: float
    perplexity: float
    tokens: int
    bytes: int
    sequences: int
    per_sequence_bpb: list[float]

    def summary(self) -> dict:
        out = asdict(self)
        out.pop("per_sequence_bpb")
        return out


@torch.no_grad()
def score(model: GPT, packed_root: str | Path, split: str = "val", batch_size: int = 16,
          max_batches: int | None = None, device: str = "cpu") -> Score:
    data = PackedSplit(packed_root, split)
    token_bytes = np.load(Path(packed_root) / "token_bytes.npy")
    model.eval().to(device)
    n = len(data) if max_batches is None else min(len(data), max_batches * batch_size)
    nll_total, tok_total, byte_total, per_seq = 0.0, 0, 0, []
    for lo in range(0, n, batch_size):
        x, y, d = data.batch(np.arange(lo, min(n, lo + batch_size)))
        _, nll = model(torch.from_numpy(x).to(device), torch.from_numpy(y).to(device),
                       torch.from_numpy(d).to(device), reduction="none")
        seq_nll = nll.double().sum(dim=1).cpu().numpy()
        seq_bytes = token_bytes[y].sum(axis=1)
        per_seq += (seq_nll / math.log(2) / np.maximum(seq_bytes, 1)).tolist()
        nll_total += float(seq_nll.sum())
        tok_total += int(y.size)
        byte_total += int(seq_bytes.sum())
    if tok_total == 0:
        raise ValueError(f"{packed_root}: split '{split}' has no windows to evaluate")
    loss = nll_total / tok_total
    return Score(loss=loss, bits_per_byte=nll_total / math.log(2) / max(byte_total, 1),
                 perplexity=math.exp(min(loss, 700)), tokens=tok_total, bytes=byte_total,
                 sequences=len(per_seq), per_sequence_bpb=per_seq)
