"""A Llama-family decoder (RMSNorm, rotary positions, SwiGLU, grouped-query attention) whose parameter
names and shapes are those of ``transformers``' ``LlamaForCausalLM``, so a Hugging Face checkpoint's
state dict loads as it is and an export is a copy (``to_hf``/``from_hf`` for ``config.json``).

Packed data as in ``trainer/model.py``: with ``doc_ids`` attention stays inside each document and the
rotary positions restart at every document start.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file

from trainer.attention import DocumentMask, attend
from trainer.model import KVCache, Shape, document_positions

ARCHITECTURE = "LlamaForCausalLM"


# LlamaConfig's shape fields and the config.json keys that hold them
_HF_FIELDS = {"vocab_size": "vocab_size", "n_layer": "num_hidden_layers", "n_head": "num_attention_heads",
              "n_kv_head": "num_key_value_heads", "n_embd": "hidden_size", "intermediate_size": "intermediate_size",
              "block_size": "max_position_embeddings"}


@dataclass(frozen=True)
class LlamaConfig(Shape):
    n_kv_head: int = 12
    intermediate_size: int = 2048
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    tie_embeddings: bool = True

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head or self.n_head % self.n_kv_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be a multiple of n_head ({self.n_head}), "
                             f"and n_head of n_kv_head ({self.n_kv_head})")
        if (self.n_embd // self.n_head) % 2:
            raise ValueError(f"head size {self.n_embd // self.n_head} must be even for rotary positions")

    def to_hf(self, bos_token_id: int | None = None, eos_token_id: int | None = None) -> dict[str, Any]:
        """``config.json`` as ``transformers`` writes it for ``LlamaForCausalLM``."""
        return {"architectures": [ARCHITECTURE], "model_type": "llama", "vocab_size": self.vocab_size,
                "hidden_size": self.n_embd, "intermediate_size": self.intermediate_size,
                "num_hidden_layers": self.n_layer, "num_attention_heads": self.n_head,
                "num_key_value_heads": self.n_kv_head, "head_dim": self.n_embd // self.n_head,
                "hidden_act": "silu", "max_position_embeddings": self.block_size, "rms_norm_eps": self.rms_norm_eps,
                "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
                "tie_word_embeddings": self.tie_embeddings, "attention_bias": False, "mlp_bias": False,
                "attention_dropout": 0.0, "bos_token_id": bos_token_id, "eos_token_id": eos_token_id,
                "torch_dtype": "float32"}

    @classmethod
    def from_hf(cls, hf: dict[str, Any], where: str = "config.json") -> LlamaConfig:
        """The config of a Hugging Face Llama checkpoint; ``ValueError`` naming ``where`` and the field for
        anything this model does not compute the same way (another architecture, biases, scaled rotary).
        The file is data: a refusal names fields and what was expected, never a value the file holds."""
        archs = hf.get("architectures") or [hf.get("model_type")]
        if archs != [ARCHITECTURE] and hf.get("model_type") != "llama":
            raise ValueError(f"{where}: architectures: expected ['{ARCHITECTURE}'] (model_type 'llama'), "
                             "this folder holds another model")
        rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
        problems = [f"{k}: expected {v!r}" for k, v in
                    (("hidden_act", "silu"), ("attention_bias", False), ("mlp_bias", False)) if hf.get(k, v) != v]
        if rope.get("rope_type", rope.get("type", "default")) != "default":
            problems.append("rope type: only the default rotary is supported (no scaling)")
        defaults = {"num_key_value_heads": hf.get("num_attention_heads"), "max_position_embeddings": 2048}
        try:
            fields = {ours: (hf.get(theirs) or defaults[theirs]) if theirs in defaults else hf[theirs]
                      for ours, theirs in _HF_FIELDS.items()}
        except KeyError as exc:
            raise ValueError(f"{where}: missing field {exc.args[0]!r}") from None
        numbers = {"rope_theta": rope.get("rope_theta", hf.get("rope_theta", 10000.0)),
                   "rms_norm_eps": hf.get("rms_norm_eps", 1e-6)}
        wrong = [_HF_FIELDS[k] for k, v in fields.items() if type(v) is not int or v <= 0]
        wrong += [k for k, v in numbers.items() if type(v) not in (int, float) or v <= 0]
        if wrong:
            problems.append(f"{', '.join(wrong)}: expected positive numbers")
        elif (head_dim := hf.get("head_dim")) is not None and head_dim != fields["n_embd"] // fields["n_head"]:
            problems.append("head_dim: differs from hidden_size / num_attention_heads")
        if problems:
            raise ValueError(f"{where}: " + "; ".join(problems))
        return cls(**fields, rope_theta=float(numbers["rope_theta"]), rms_norm_eps=float(numbers["rms_norm_eps"]),
                   tie_embeddings=bool(hf.get("tie_word_embeddings", False)))


class RMSNorm(nn.Module):
    """As ``LlamaRMSNorm``: normalized in float32, scaled in the input's dtype."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rotary(pos: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) positions → cos, sin of shape (B, 1, T, head_dim), as ``LlamaRotaryEmbedding`` computes them."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float, device=pos.device) / head_dim))
    freqs = pos[..., None].float() * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)[:, None]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.n_head, self.n_kv, self.hd = cfg.n_head, cfg.n_kv_head, cfg.n_embd // cfg.n_head
        self.q_proj = nn.Linear(cfg.n_embd, cfg.n_head * self.hd, bias=False)
        self.k_proj = nn.Linear(cfg.n_embd, cfg.n_kv_head * self.hd, bias=False)
        self.v_proj = nn.Linear(cfg.n_embd, cfg.n_kv_head * self.hd, bias=False)
        self.o_proj = nn.Linear(cfg.n_head * self.hd, cfg.n_embd, bias=False)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: DocumentMask | None,
                cache: KVCache | None = None, layer: int = 0) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_head, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv, self.hd).transpose(1, 2)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        if cache is not None:  # cached before the heads are repeated: n_kv heads' worth of memory
            k, v = cache.extend(layer, k, v)
        if self.n_kv != self.n_head:  # grouped-query attention: each key/value head serves n_head / n_kv heads
            k, v = (t.repeat_interleave(self.n_head // self.n_kv, dim=1) for t in (k, v))
        y = attend(q, k, v, mask, self.dropout if self.training else 0.0)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.n_embd, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.n_embd, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.n_embd, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.n_embd, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: DocumentMask | None,
                cache: KVCache | None = None, layer: int = 0) -> torch.Tensor:
        x = x + self.drop(self.self_attn(self.input_layernorm(x), cos, sin, mask, cache, layer))
        return x + self.drop(self.mlp(self.post_attention_layernorm(x)))


class Backbone(nn.Module):
    """``LlamaModel``'s parameters: ``embed_tokens``, ``layers``, ``norm``."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.n_embd, cfg.rms_norm_eps)


class Llama(nn.Module):
    """``LlamaForCausalLM``'s parameter tree (``model.*``, ``lm_head``) with GPT's training interface."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self, non_embedding: bool = True) -> int:
        n = sum(p.numel() for p in self.parameters())
        return n - self.model.embed_tokens.weight.numel() if non_embedding and not self.cfg.tie_embeddings else n

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None,
                doc_ids: torch.Tensor | None = None, reduction: str = "mean",
                cache: KVCache | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        B, T = idx.shape
        start = cache.length if cache is not None else 0
        if start + T > self.cfg.block_size:
            raise ValueError(f"sequence of {start + T} tokens exceeds block_size {self.cfg.block_size}")
        if doc_ids is None:
            pos, mask = torch.arange(start, start + T, device=idx.device)[None].expand(B, T), None
        else:
            pos, mask = document_positions(doc_ids), DocumentMask(doc_ids)
        x = self.model.embed_tokens(idx)
        cos, sin = rotary(pos, self.cfg.n_embd // self.cfg.n_head, self.cfg.rope_theta, x.dtype)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, mask, cache, i)
        logits = self.lm_head(self.model.norm(x))
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1), reduction=reduction)
        return logits, loss if reduction == "mean" else loss.view(B, T)


def load_state(model: Llama, state: dict[str, torch.Tensor], where: str) -> None:
    """``state`` (a Hugging Face checkpoint's tensors) into ``model``; ``ValueError`` naming ``where`` and
    each missing, unexpected or misshapen tensor. A tied head may be absent (``save_pretrained`` drops it)."""
    own = model.state_dict()
    optional = {"lm_head.weight"} if model.cfg.tie_embeddings else set()
    missing = sorted(set(own) - set(state) - optional)
    unexpected = sorted(k for k in set(state) - set(own) if not k.endswith("rotary_emb.inv_freq"))
    shapes = [f"{k} {tuple(state[k].shape)}, expected {tuple(own[k].shape)}" for k in sorted(set(own) & set(state))
              if state[k].shape != own[k].shape]
    problems = ([f"missing {', '.join(missing[:8])}"] if missing else []) + \
               ([f"unexpected {', '.join(unexpected[:8])}"] if unexpected else []) + shapes[:8]
    if problems:
        raise ValueError(f"{where}: " + "; ".join(problems))
    with torch.no_grad():
        for k, t in state.items():
            if k in own:
                own[k].copy_(t)


def read_folder(folder: str | Path) -> tuple[LlamaConfig, dict[str, torch.Tensor]]:
    """A Hugging Face-format folder's config and tensors: ``config.json`` with ``model.safetensors`` or a
    sharded ``model.safetensors.index.json``; ``ValueError`` naming the file for anything missing."""
    root = Path(folder)
    config = root / "config.json"
    if not config.is_file():
        raise ValueError(f"{config}: missing; a Hugging Face model folder holds config.json")
    cfg = LlamaConfig.from_hf(json.loads(config.read_text()), str(config))
    single, index = root / "model.safetensors", root / "model.safetensors.index.json"
    if single.is_file():
        files = [single]
    elif index.is_file():
        files = [root / name for name in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
        if absent := [f.name for f in files if not f.is_file()]:
            raise ValueError(f"{index}: names {', '.join(absent[:4])}, which the folder does not hold")
    else:
        raise ValueError(f"{root}: holds neither model.safetensors nor model.safetensors.index.json")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    return cfg, state
