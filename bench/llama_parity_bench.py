"""Logits of Taxiway's Llama (``trainer/llama.py``) vs ``transformers``' ``LlamaForCausalLM`` on the same
weights and tokens, fp32: the checkpoint is written by ``save_pretrained`` of a random model (nothing is
downloaded) and read by ``trainer.llama.read_folder``; also the export read back by
``AutoModelForCausalLM``. Target (issue 44): max abs difference ≤ 1e-4. Figures per shape: max abs
difference over ``--batches`` random batches, and the max abs logit for scale.

    .venv/bin/python bench/llama_parity_bench.py --batches 5
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import harness

sys.path.insert(0, str(harness.REPO))

SHAPES = {  # name: (layers, width, heads, kv heads, intermediate, vocab, tied)
    "gqa-untied": (4, 256, 8, 2, 688, 4096, False),
    "mha-tied": (4, 256, 8, 8, 688, 4096, True),
}


def measure(shape: tuple, batches: int, seq: int) -> dict:
    import torch
    import transformers
    from safetensors.torch import save_file

    from trainer.llama import Llama, load_state, read_folder

    layers, width, heads, kv, inter, vocab, tied = shape
    hf_cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=width, intermediate_size=inter,
                                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
                                      max_position_embeddings=seq, tie_word_embeddings=tied, rms_norm_eps=1e-5)
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(hf_cfg).eval()
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(Path(tmp) / "hf")
        cfg, state = read_folder(Path(tmp) / "hf")
        ours = Llama(cfg).eval()
        load_state(ours, state, tmp)
        out = Path(tmp) / "export"
        out.mkdir()
        (out / "config.json").write_text(json.dumps(cfg.to_hf()))
        save_file({k: v.contiguous() for k, v in ours.state_dict().items() if not (tied and k == "lm_head.weight")},
                  str(out / "model.safetensors"), metadata={"format": "pt"})
        back = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
        eager = transformers.LlamaForCausalLM.from_pretrained(Path(tmp) / "hf", attn_implementation="eager").eval()
        diffs, back_diffs, eager_diffs, scale = [], [], [], 0.0
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for _ in range(batches):
                idx = torch.randint(0, vocab, (4, seq), generator=gen)
                want = hf(input_ids=idx).logits
                got, _ = ours(idx)
                diffs.append((got - want).abs().max().item())
                back_diffs.append((back(input_ids=idx).logits - got).abs().max().item())
                eager_diffs.append((eager(input_ids=idx).logits - got).abs().max().item())
                scale = max(scale, want.abs().max().item())
    return {"max_abs_diff": max(diffs), "export_max_abs_diff": max(back_diffs),
            "eager_max_abs_diff": max(eager_diffs), "max_abs_logit": scale,
            "parameters": sum(p.numel() for p in ours.parameters()), "batches": batches, "seq": seq}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=5)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--out", type=Path, default=harness.REPO / "bench" / "results")
    args = ap.parse_args()
    started = harness.start()
    figures = {name: measure(shape, args.batches, args.seq) for name, shape in SHAPES.items()}
    table = harness.markdown(
        ["shape", "parameters", "max abs diff (ours vs transformers, sdpa)", "vs transformers, eager attention",
         "export read back by transformers", "max |logit|"],
        [[n, f"{f['parameters']:,}", f"{f['max_abs_diff']:.2e}", f"{f['eager_max_abs_diff']:.2e}",
          f"{f['export_max_abs_diff']:.2e}",
          f"{f['max_abs_logit']:.2f}"] for n, f in figures.items()])
    path = harness.write("llama_parity", f".venv/bin/python bench/llama_parity_bench.py --batches {args.batches} "
                         f"--seq {args.seq}", "fp32 on CPU; target max abs diff <= 1e-4 (issue 44)", figures, table,
                         args.out, started)
    print(table)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
