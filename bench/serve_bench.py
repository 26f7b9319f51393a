"""A registered Llama version served by ``mlflow models serve`` (as docs/models.md shows): seconds from
starting the CLI to its first answer (ready: ``/ping``; first answer: the first ``/invocations``), and
the median answer time for ``--tokens`` greedy new tokens, side by side with the same generation in
process (``transformers``' ``generate`` on the same folder, and Taxiway's own sampler with its KV
cache), all on the same prompt and checked to give the same text. The model has the demo config's
shape and random weights (speed does not depend on what it learned), the demo corpus's tokenizer, and
is registered to a SQLite MLflow store of its own.

    .venv/bin/python bench/serve_bench.py --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness

sys.path.insert(0, str(harness.REPO))
PROMPT = "Once upon a time"


def _registered(home: Path) -> tuple[str, Path]:
    """A demo-shaped Llama exported and registered as Taxiway registers a version: (models:/ URI, folder)."""
    import torch

    from pipelines import stages
    from pipelines.config import load_config
    from pipelines.demo_data import write_demo_data
    from pipelines.registry import client, served
    from trainer import arch, weights

    write_demo_data(home / "demo-data", seed=0, max_files=40, force=True)
    cfg = load_config(harness.REPO / "configs" / "demo.yaml")
    run_dir = home / "runs" / "serve-bench"
    stages.prepare.prepare(cfg, run_dir)
    packed = stages.tokenize.reduce(cfg, run_dir)
    torch.manual_seed(0)
    model_cfg = arch.config_from_dict(cfg.model.trainer_fields(packed.manifest()["vocab_size"]), "demo.yaml")
    weights.export(arch.build(model_cfg).state_dict(), model_cfg, run_dir / "model", {"global_step": 0})
    folder = stages.train.finish(run_dir)
    c = client()
    run_id = c.create_run(c.create_experiment("serve-bench")).info.run_id
    served.log_model(c, run_id, folder)
    c.create_registered_model("serve-bench")
    mv = c.create_model_version("serve-bench", f"{c.get_run(run_id).info.artifact_uri}/model", run_id=run_id)
    return f"models:/serve-bench/{mv.version}", folder


def _serve(uri: str, tokens: int, repeats: int, env: dict[str, str], log: Path) -> dict:
    import httpx

    with socket.socket() as probe:  # a free loopback port
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    t0 = time.perf_counter()
    with open(log, "ab") as out:
        proc = subprocess.Popen([str(Path(sys.executable).with_name("mlflow")), "models", "serve", "-m", uri,
                                 "--env-manager", "local", "--host", "127.0.0.1", "--port", str(port)],
                                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(log.read_text()[-3000:])
            try:
                if httpx.get(f"http://127.0.0.1:{port}/ping", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        ready = time.perf_counter() - t0
        body = {"inputs": [PROMPT], "params": {"max_new_tokens": tokens}}
        answers, texts = [], []
        for _ in range(repeats + 1):
            t = time.perf_counter()
            r = httpx.post(f"http://127.0.0.1:{port}/invocations", json=body, timeout=600)
            r.raise_for_status()
            answers.append(time.perf_counter() - t)
            texts.append(r.json()["predictions"][0])
        return {"ready_s": round(ready, 2), "first_answer_s": round(ready + answers[0], 2),
                "answer_median_s": round(statistics.median(answers[1:]), 3), "answers_s": [round(a, 3) for a in answers],
                "text": texts[0]}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def _in_process(folder: Path, tokens: int, repeats: int) -> dict:
    import torch
    import transformers

    from eval.generate import sample
    from eval.model_files import load_model

    tok = transformers.AutoTokenizer.from_pretrained(folder)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    ours = load_model(folder)[0]
    ids = tok(PROMPT)["input_ids"]
    out: dict[str, list[float]] = {"transformers": [], "taxiway": []}
    texts = {}
    for _ in range(repeats):
        t = time.perf_counter()
        with torch.no_grad():
            gen = hf.generate(torch.tensor([ids]), max_new_tokens=tokens, do_sample=False)
        out["transformers"].append(time.perf_counter() - t)
        texts["transformers"] = tok.decode(gen[0], skip_special_tokens=True)
        t = time.perf_counter()
        new = sample(ours, ids, tokens, 0.0, None, 0, tok.eos_token_id, "cpu")
        out["taxiway"].append(time.perf_counter() - t)
        texts["taxiway"] = tok.decode(ids + new, skip_special_tokens=True)
    return {k: {"median_s": round(statistics.median(v), 3), "runs_s": [round(x, 3) for x in v], "text": texts[k]}
            for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--out", type=Path, default=harness.REPO / "bench" / "results")
    args = ap.parse_args()
    started = harness.start()
    with tempfile.TemporaryDirectory(prefix="serve-bench-") as tmp:
        home = Path(tmp)
        env = {**os.environ, "TAXIWAY_HOME": str(home), "MLFLOW_TRACKING_URI": f"sqlite:///{home}/mlflow.db",
               "HF_HUB_OFFLINE": "1", "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
        os.environ.update(env)
        uri, folder = _registered(home)
        serving = _serve(uri, args.tokens, args.repeats, env, home / "serve.log")
        local = _in_process(folder, args.tokens, args.repeats)
    same = serving["text"] == local["transformers"]["text"] == local["taxiway"]["text"]
    served = {"prompt": PROMPT, "answer": serving.pop("text")}  # what /invocations returned, as it returned it
    figures = {"serve": serving, "in_process": {k: {kk: vv for kk, vv in v.items() if kk != "text"}
                                                for k, v in local.items()}, "same_text": same, "served": served}
    table = harness.markdown(
        ["method", "ready (s)", "first answer (s)", f"answer, {args.tokens} tokens (median s)"],
        [["mlflow models serve (HTTP)", serving["ready_s"], serving["first_answer_s"], serving["answer_median_s"]],
         ["transformers generate, in process", "–", "–", local["transformers"]["median_s"]],
         ["taxiway sampler (KV cache), in process", "–", "–", local["taxiway"]["median_s"]]])
    path = harness.write("serve", f".venv/bin/python bench/serve_bench.py --repeats {args.repeats} "
                         f"--tokens {args.tokens}", f"demo-shaped Llama, random weights, greedy; same text: {same}",
                         figures, table, args.out, started)
    print(table)
    print(json.dumps({"same_text": same}))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
