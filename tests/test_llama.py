"""The Llama-family model (``trainer/llama.py``) against ``transformers``' ``LlamaForCausalLM``: a
checkpoint ``save_pretrained`` wrote loads as it is and gives the same logits (fp32, ≤ 1e-4), an export
loads in ``transformers`` the same way back, packed documents never see each other, and a folder this
model cannot compute the same way is refused naming the file and the field. Checkpoints are made here
(small random models): nothing is downloaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from trainer.llama import Llama, LlamaConfig, load_state, read_folder

TOL = 1e-4


def _hf_model(folder: Path, tied: bool, kv_heads: int):
    import transformers

    cfg = transformers.LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                   num_attention_heads=8, num_key_value_heads=kv_heads, max_position_embeddings=64,
                                   rms_norm_eps=1e-5, tie_word_embeddings=tied,
                                   rope_parameters={"rope_type": "default", "rope_theta": 5000.0})
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # norms away from 1, so a misplaced norm weight shows
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    model.save_pretrained(folder)
    return model


@pytest.mark.parametrize(("tied", "kv_heads"), [(False, 2), (True, 8)])
def test_a_transformers_checkpoint_loads_as_it_is_and_gives_the_same_logits(tmp_path: Path, tied: bool, kv_heads: int):
    hf = _hf_model(tmp_path / "hf", tied, kv_heads)
    cfg, state = read_folder(tmp_path / "hf")
    assert (cfg.n_kv_head, cfg.tie_embeddings, cfg.rope_theta) == (kv_heads, tied, 5000.0)
    ours = Llama(cfg).eval()
    load_state(ours, state, str(tmp_path / "hf"))
    idx = torch.randint(0, 97, (3, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf(input_ids=idx).logits
        got, _ = ours(idx)
    assert (got - want).abs().max().item() <= TOL

    # export: our tensors and config.json, loaded by transformers, give the same logits back
    import transformers
    from safetensors.torch import save_file

    out = tmp_path / "export"
    out.mkdir()
    (out / "config.json").write_text(json.dumps(cfg.to_hf()))
    tensors = {k: v.contiguous() for k, v in ours.state_dict().items() if not (tied and k == "lm_head.weight")}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    back = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        assert (back(input_ids=idx).logits - got).abs().max().item() <= TOL


def test_packed_documents_attend_only_within_themselves_and_restart_their_positions():
    torch.manual_seed(0)
    model = Llama(LlamaConfig(vocab_size=50, n_layer=2, n_head=4, n_kv_head=2, n_embd=32, intermediate_size=64,
                              block_size=32)).eval()
    a, b = torch.randint(0, 50, (1, 7)), torch.randint(0, 50, (1, 9))
    packed = torch.cat([a, b], dim=1)
    doc_ids = torch.tensor([[0] * 7 + [1] * 9])
    with torch.no_grad():
        together, _ = model(packed, doc_ids=doc_ids)
        alone_a, _ = model(a)
        alone_b, _ = model(b)
    assert torch.allclose(together[:, :7], alone_a, atol=1e-5)
    assert torch.allclose(together[:, 7:], alone_b, atol=1e-5)


def test_a_folder_this_model_cannot_compute_the_same_way_is_refused_naming_file_and_field(tmp_path: Path):
    _hf_model(tmp_path / "hf", False, 2)
    config = tmp_path / "hf" / "config.json"
    good = json.loads(config.read_text())
    for change, named in (({"architectures": ["MistralForCausalLM"], "model_type": "mistral"}, "architectures"),
                          ({"attention_bias": True}, "attention_bias: expected False"),
                          ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 1.0}}, "rope type: only the default"),
                          ({"hidden_size": "<a secret in the file>"}, "hidden_size: expected positive numbers"),
                          ({"rms_norm_eps": "<a secret in the file>"}, "rms_norm_eps: expected positive numbers")):
        config.write_text(json.dumps({**good, **change}))
        with pytest.raises(ValueError, match=f"{config}: .*{named}") as refused:
            read_folder(tmp_path / "hf")
        assert "secret" not in str(refused.value) and "Mistral" not in str(refused.value)  # data is never echoed
    config.write_text(json.dumps({**good, "hidden_size": 128, "head_dim": 16}))  # tensors of another width
    cfg, state = read_folder(tmp_path / "hf")
    with pytest.raises(ValueError, match=r"model.embed_tokens.weight \(97, 64\), expected \(97, 128\)"):
        load_state(Llama(cfg), state, str(tmp_path / "hf"))
    (tmp_path / "hf" / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="holds neither model.safetensors nor model.safetensors.index.json"):
        read_folder(tmp_path / "hf")
    config.unlink()
    with pytest.raises(ValueError, match=r"config.json: missing"):
        read_folder(tmp_path / "hf")


def test_a_cached_step_gives_the_logits_of_the_whole_sequence():
    """One token a step through the KV cache (grouped-query heads cached before they are repeated) gives
    the logits the whole sequence gives at each position; greedy generation reads the same."""
    from eval.generate import sample
    from trainer.model import KVCache

    torch.manual_seed(0)
    model = Llama(LlamaConfig(vocab_size=50, n_layer=2, n_head=4, n_kv_head=2, n_embd=32, intermediate_size=64,
                              block_size=24)).eval()
    idx = torch.randint(0, 50, (1, 12))
    cache = KVCache(2)
    with torch.no_grad():
        whole, _ = model(idx)
        steps = [model(idx[:, :5], cache=cache)[0]] + [model(idx[:, t:t + 1], cache=cache)[0] for t in range(5, 12)]
    assert torch.allclose(torch.cat(steps, dim=1), whole, atol=1e-5)
    assert sample(model, [3, 1, 4], 30, 0.0) == sample(model, [3, 1, 4], 30, 0.0, cache=False)  # past block_size too
