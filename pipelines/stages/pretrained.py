"""A Hugging Face model folder a run starts from (``pretrained``): fetched into the run folder and
checked when the run is prepared, before any compute — the architecture (``config.json``), every
tensor's name and shape against it (from the safetensors headers, without reading the weights), and
the tokenizer (``tokenizer.json``, whose ids must fit the embedding and which must know
``tokenizer.eos_token``). Its tokenizer then packs the data (no BPE training), its weights are the
trainer's start, and it is the baseline while no champion is registered."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from pipelines import storage
from pipelines.config import ModelConfig, RunConfig, limits
from pipelines.errors import BadInput
from pipelines.run_folder import RunFolder
from trainer import fsio

CONFIG, TOKENIZER = "config.json", "tokenizer.json"
SINGLE, INDEX = "model.safetensors", "model.safetensors.index.json"
_SHOWN = 6


class PretrainedError(BadInput):
    """A pretrained folder Taxiway cannot start from; the message names the file and what was expected."""


def folder(cfg: RunConfig, run_dir: Path) -> Path | None:
    """The run's copy of ``cfg.pretrained``: fetched and checked once (``fetch``), None without one."""
    if not cfg.pretrained:
        return None
    local = RunFolder(run_dir).pretrained
    if not (local / CONFIG).is_file():
        raise PretrainedError(f"{local}: missing; the run was not prepared with pretrained {cfg.pretrained!r}")
    return local


def fetch(cfg: RunConfig, run_dir: Path) -> Path | None:
    """Copy the files Taxiway reads from ``cfg.pretrained`` into the run folder (a local file is
    hard-linked where it can be) and check them; a folder already fetched is only checked."""
    if not cfg.pretrained:
        return None
    final = RunFolder(run_dir).pretrained
    if (final / CONFIG).is_file():
        check(final, cfg)
        return final
    source = storage.locate(cfg.pretrained)
    with fsio.staged_dir(final) as tmp:  # checked before it is renamed into place: a refused folder leaves nothing
        for name in _wanted(source):
            _copy(source.join(name), tmp / name)
        check(tmp, cfg)
    return final


def _wanted(source: storage.Location) -> list[str]:
    """config.json, tokenizer.json and the weights: one file or an index and the shards it names."""
    present = {storage.relative(loc, source) for loc in storage.list_files(source.uri())}
    missing = [name for name in (CONFIG, TOKENIZER) if name not in present]
    if SINGLE in present:
        weights = [SINGLE]
    elif INDEX in present:
        shards = _shards(storage.read_bytes(source.join(INDEX)))
        missing += [f"{s} (named by {INDEX})" for s in shards if s not in present]
        weights = [INDEX, *shards]
    else:
        missing.append(f"{SINGLE} or {INDEX}")
        weights = []
    if missing:
        raise PretrainedError(f"pretrained {source.uri()}: missing {', '.join(missing)}; a Hugging Face model "
                              "folder holds config.json, the weights as safetensors and tokenizer.json")
    return [CONFIG, TOKENIZER, *weights]


def _shards(index: bytes) -> list[str]:
    """The weight files a sharded index names (its ``weight_map``'s values), each a plain file name."""
    try:
        names = sorted(set(json.loads(index)["weight_map"].values()))
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError):
        names = None
    if not names or not all(isinstance(n, str) and n == os.path.basename(n) and n.endswith(".safetensors")
                            for n in names):
        raise PretrainedError(f"pretrained {INDEX}: expected a weight_map of tensor names to .safetensors files "
                              "in the folder")
    return names


def _copy(src: storage.Location, dest: Path) -> None:
    if src.local:
        try:
            os.link(src.path, dest)
            return
        except OSError:  # another filesystem: a copy
            shutil.copyfile(src.path, dest)
            return
    src.fs.get(src.path, str(dest))


def effective(cfg: RunConfig, run_dir: Path) -> RunConfig:
    """``cfg`` as the run trains it: with a pretrained start, the model section and vocabulary are the
    folder's, so the limits and the disk estimate hold the model actually built, not ``model.*``."""
    start = folder(cfg, run_dir)
    return cfg if start is None else _as_trained(cfg, _model(start))


def _model(local: Path) -> Any:
    """The folder's ``config.json`` as ``trainer.llama.LlamaConfig``."""
    from trainer.llama import LlamaConfig  # torch (~1 s): DAG files import prepare, which calls this

    try:
        return LlamaConfig.from_hf(json.loads((local / CONFIG).read_text()), f"pretrained {CONFIG}")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PretrainedError(f"pretrained {CONFIG}: not JSON ({type(exc).__name__})") from None
    except ValueError as exc:
        raise PretrainedError(str(exc)) from None


def _as_trained(cfg: RunConfig, model: Any) -> RunConfig:
    try:
        section = ModelConfig(arch="llama", n_layer=model.n_layer, n_head=model.n_head, n_embd=model.n_embd,
                              block_size=model.block_size, dropout=cfg.model.dropout, n_kv_head=model.n_kv_head,
                              intermediate_size=model.intermediate_size, rope_theta=model.rope_theta,
                              rms_norm_eps=model.rms_norm_eps, tie_embeddings=model.tie_embeddings)
    except ValidationError as exc:
        fields = ", ".join(".".join(map(str, e["loc"])) or "shape" for e in exc.errors())
        raise PretrainedError(f"pretrained {CONFIG}: {fields} outside the bounds of model.*") from None
    return cfg.model_copy(update={"model": section, "tokenizer": cfg.tokenizer.model_copy(
        update={"vocab_size": model.vocab_size})})


def check(local: Path, cfg: RunConfig) -> None:
    """Refuse, naming the file and what was expected, a folder the trainer could not start from; and one
    whose model is over the deployment's ``limits`` (parameters, checkpoint disk)."""
    from pipelines.tokenize import bpe  # tokenizers: DAG parse must not load it (tests/test_dag.py)

    model = _model(local)
    if problems := limits.problems(_as_trained(cfg, model), model.vocab_size):
        raise PretrainedError(f"pretrained {CONFIG}: " + "; ".join(problems))
    if cfg.pack.seq_len > model.block_size:
        raise PretrainedError(f"pack.seq_len ({cfg.pack.seq_len}) exceeds the pretrained model's context "
                              f"(max_position_embeddings {model.block_size} in {CONFIG})")
    _check_tensors(local, model)
    try:
        tok = bpe.load(local / TOKENIZER, cfg.tokenizer.eos_token)
    except bpe.TokenizerError as exc:
        raise PretrainedError(f"pretrained {exc}") from None
    if (n := tok.get_vocab_size(with_added_tokens=True)) > model.vocab_size:
        raise PretrainedError(f"pretrained {TOKENIZER}: {n:,} tokens, but {CONFIG} vocab_size is "
                              f"{model.vocab_size:,}: ids past the embedding have no row")


def _check_tensors(local: Path, model: Any) -> None:
    """Every tensor the model needs, of the shape ``config.json`` implies; read from the headers only."""
    import torch  # as above

    from trainer.llama import Llama  # as above

    with torch.device("meta"):
        want = {k: tuple(v.shape) for k, v in Llama(model).state_dict().items()}
    if model.tie_embeddings:
        want.pop("lm_head.weight")
    have = _shapes(local)
    problems = [f"{name} missing" for name in want if name not in have]
    problems += [f"{name} is {have[name][1]}, expected {shape} from {CONFIG}" for name, shape in want.items()
                 if name in have and tuple(have[name][1]) != shape]
    if problems:
        shown = "; ".join(problems[:_SHOWN]) + (f"; and {len(problems) - _SHOWN} more" if len(problems) > _SHOWN else "")
        files = sorted({have[n][0] for n in want if n in have}) or [SINGLE]
        raise PretrainedError(f"pretrained {', '.join(files)}: {shown}")


def _shapes(local: Path) -> dict[str, tuple[str, list[int]]]:
    """Tensor name → (file, shape), from the safetensors headers."""
    from safetensors import safe_open  # as torch above: only a run with a pretrained folder pays for it

    files = [SINGLE] if (local / SINGLE).is_file() else _shards((local / INDEX).read_bytes())
    out: dict[str, tuple[str, list[int]]] = {}
    for name in files:
        try:
            with safe_open(str(local / name), framework="np") as f:
                out.update({k: (name, f.get_slice(k).get_shape()) for k in f.keys()})  # noqa: SIM118 (not a dict)
        except Exception as exc:  # safetensors raises its own SafetensorError for a bad header or size
            raise PretrainedError(f"pretrained {name}: unreadable safetensors ({type(exc).__name__})") from None
    return out
