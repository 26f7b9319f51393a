"""Model FLOPs utilisation: achieved training FLOP/s over the hardware's peak.

FLOPs per token follow the PaLM paper (appendix B), as nanoGPT does: ``6 N + 12 L H Q T`` with
N the parameters without the position embedding, L layers, H heads, Q head size, T sequence
length (the full causal window: the document mask is not counted as savings, so MFU stays
comparable with other trainers). Peak FLOP/s are dense bf16 figures of the data sheet, per
device; ``train.peak_tflops`` overrides them (and is the only way to get an MFU on CPU).
"""

from __future__ import annotations

import torch

from trainer.arch import CausalLM

PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "GH200": 989.0, "A100": 312.0, "L40S": 362.0, "L4": 121.0,
                    "A10": 125.0}


def flops_per_token(model: CausalLM, seq_len: int) -> float:
    cfg = model.cfg
    return 6 * model.num_params() + 12 * cfg.n_layer * cfg.n_embd * seq_len


def peak_flops(device: torch.device, bf16: bool, override_tflops: float | None) -> float | None:
    """Per-device peak FLOP/s, or None when unknown (CPU without an override, fp32 on GPU)."""
    if override_tflops:
        return override_tflops * 1e12
    if device.type != "cuda" or not bf16:
        return None
    name = torch.cuda.get_device_name(device)
    for key in sorted(PEAK_BF16_TFLOPS, key=len, reverse=True):
        if key in name:
            return PEAK_BF16_TFLOPS[key] * 1e12
    return None


def mfu(flops_token: float, tokens_per_s: float, peak: float | None, devices: int) -> float | None:
    return None if peak is None else flops_token * tokens_per_s / (peak * devices)
