"""Which model a run trains, by one name (``arch``): the Llama family (the default for new configs,
tensors named as ``transformers``' ``LlamaForCausalLM``) or Taxiway's first GPT (kept, so a refresh of
a GPT version goes on as a GPT). The trainer, the export and evaluation build, describe and read back
a model only through here, never by class."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from torch import nn

from trainer.llama import Llama, LlamaConfig
from trainer.model import GPT, GPTConfig

Config = GPTConfig | LlamaConfig
CausalLM = GPT | Llama
_ARCHS: dict[str, tuple[type, type]] = {"gpt": (GPTConfig, GPT), "llama": (LlamaConfig, Llama)}
# model.json and spec.json written before ``arch`` existed describe a GPT
_UNNAMED = "gpt"


def config_from_dict(raw: dict[str, Any], where: str) -> Config:
    """The model ``raw`` describes (``arch`` and its fields); ``ValueError`` naming ``where`` and the field."""
    raw = dict(raw)
    arch = raw.pop("arch", _UNNAMED)
    if arch not in _ARCHS:
        raise ValueError(f"{where}: arch {arch!r} is not one Taxiway trains (expected one of {', '.join(_ARCHS)})")
    cls = _ARCHS[arch][0]
    names = {f.name for f in fields(cls)}
    if unknown := sorted(set(raw) - names):
        raise ValueError(f"{where}: field(s) {', '.join(unknown)} do not belong to arch {arch}")
    try:
        return cls(**raw)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None


def arch_of(cfg: Config) -> str:
    return "llama" if isinstance(cfg, LlamaConfig) else "gpt"


def describe(cfg: Config) -> dict[str, Any]:
    """``cfg`` as ``config_from_dict`` reads it back."""
    return {"arch": arch_of(cfg), **cfg.to_dict()}


def build(cfg: Config) -> CausalLM:
    return _ARCHS[arch_of(cfg)][1](cfg)


def layers(model: CausalLM) -> nn.ModuleList:
    """The repeated blocks, each its own FSDP unit."""
    return model.model.layers if isinstance(model, Llama) else model.blocks


def tied(cfg: Config) -> bool:
    """Whether ``lm_head.weight`` is the token embedding (an export leaves it out, as ``save_pretrained`` does)."""
    return cfg.tie_embeddings if isinstance(cfg, LlamaConfig) else True
