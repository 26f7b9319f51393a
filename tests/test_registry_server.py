"""Registration behind a real MLflow tracking server (deploy/local/mlflow_server.py), where clients see
only ``http://``: the champion lock is a registered model with a lease, and a dead holder's lease
is broken by exactly one of the processes waiting for it; a model is registered, promoted and
generated from through the server alone."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import httpx
import pytest
import s3_server
from contenders import BARRIER, all_succeed
from model_server import served
from trained_models import clone_run, make_run

from conftest import REPO, cli

pytestmark = pytest.mark.mlflow_server

ROUNDS = 5   # independent races in one test, each on a lock of its own that a dead holder left
WAITERS = 4  # processes racing for each of them at the same instant
LEASE_S = 2.0

_DEAD_HOLDER = textwrap.dedent("""
    import contextlib, sys, time
    from pipelines.registry import client, locks
    lease, keys = float(sys.argv[1]), sys.argv[2:]
    with contextlib.ExitStack() as stack:
        for key in keys:
            stack.enter_context(locks.registry_lock(client(), key, 30, lease_s=lease))
        print("held", flush=True)
        time.sleep(600)  # SIGKILLed here, mid-lease
""")

_WAITER = BARRIER + textwrap.dedent("""
    import json, sys, time
    from pipelines.registry import client, locks
    prefix, log, folder, me, n, rounds = sys.argv[1:7]
    for rnd in range(int(rounds)):
        barrier(folder, rnd, me, int(n))
        with locks.registry_lock(client(), f"{prefix}-{rnd}", 60):
            start = time.time()
            time.sleep(0.05)
            end = time.time()
        with open(log, "a") as fh:
            fh.write(json.dumps({"round": rnd, "waiter": me, "start": start, "end": end}) + "\\n")
""")


@pytest.fixture
def on_server(tracking_server, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking_server.uri)
    return tracking_server


def test_a_dead_holders_lease_is_broken_by_exactly_one_waiter(on_server, tmp_path: Path):
    """A holder is SIGKILLed holding ROUNDS locks; once its leases ran out, WAITERS processes race for
    each lock at the same instant: every one gets it in turn, no two holds overlap, and exactly one
    of them breaks the dead holder's lease (two breakers would each delete and create the lock)."""
    from pipelines.registry import client

    prefix, c = f"lease-{uuid.uuid4().hex[:6]}", client()
    keys = [f"{prefix}-{rnd}" for rnd in range(ROUNDS)]
    holder = subprocess.Popen([sys.executable, "-c", _DEAD_HOLDER, str(LEASE_S), *keys], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held", holder.stderr.read()[-3000:]
    finally:
        holder.kill()
        holder.wait()
    dead = {key: c.get_registered_model(key).tags for key in keys}
    folder, log = tmp_path / "barrier", tmp_path / "held.jsonl"
    folder.mkdir()
    waiters = [subprocess.Popen([sys.executable, "-c", _WAITER, prefix, str(log), str(folder), str(i),
                                 str(WAITERS + 1), str(ROUNDS)], cwd=REPO, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for i in range(WAITERS)]
    # the test is the last contender at every round's gate: the waiters go once every lease ran out
    time.sleep(max(0.0, max(int(t["expires_ms"]) for t in dead.values()) / 1000 - time.time()) + 0.1)
    for rnd in range(ROUNDS):
        (folder / f"{rnd}-go").touch()
    all_succeed(waiters, timeout_s=300)
    stderr = "".join(p.stderr.read() for p in waiters)

    holds = [json.loads(line) for line in log.read_text().splitlines()]
    problems = []
    for rnd, key in enumerate(keys):
        got = sorted(h["waiter"] for h in holds if h["round"] == rnd)
        if got != [str(i) for i in range(WAITERS)]:
            problems.append(f"round {rnd}: the lock went to waiters {got}")
        spans = sorted((h["start"], h["end"]) for h in holds if h["round"] == rnd)
        if overlaps := [(a, b) for a, b in zip(spans, spans[1:], strict=False) if a[1] > b[0]]:
            problems.append(f"round {rnd}: {len(overlaps)} overlapping holds {overlaps}")
        breaks = len(re.findall(rf"breaking .* of {re.escape(dead[key]['holder'])}:", stderr))
        if breaks != 1:
            problems.append(f"round {rnd}: the dead holder's lease was broken {breaks} times")
    assert not problems, "\n".join(problems) + f"\nwaiters' stderr:\n{stderr[-3000:]}"
    assert c.search_registered_models(f"name LIKE '{prefix}%'") == [], "a lock or a break token was left behind"


def test_registration_moves_the_champion_and_generate_loads_it_through_the_server(on_server, demo_data, home: Path):
    """Champion by the floor, then beaten by a better model evaluated against it (downloaded through
    the server's artifact proxy); ``taxiway generate models:/NAME@champion`` loads the new one."""
    from pipelines import stages
    from pipelines.registry import client

    name = f"server-{uuid.uuid4().hex[:6]}"
    results = []
    for label, steps in (("reg-weak", 5), ("reg-medium", 60)):
        trained = make_run(home, label, steps, [f"name={label}"])  # its own home: a session run built under
        # this test's TAXIWAY_HOME would point other tests at this test's cache
        run_dir = clone_run(home, trained, f"{name}-{label}", [f"registry.model_name={name}", f"name={name}",
                                                               "registry.retry_backoff_s=0.2"])
        cfg = stages.prepare.load_run_config(run_dir)
        assert stages.evaluate.run(cfg, run_dir, None)["passed"]
        results.append(stages.register.run(cfg, run_dir, f"{name}-{label}", None))
    assert [(r["alias"], r["version"]) for r in results] == [("champion", "1"), ("champion", "2")]

    c = client()
    champion = c.get_model_version_by_alias(name, "champion")
    assert str(champion.version) == "2" and champion.tags["taxiway.replaced_champion"] == f"models:/{name}/1"
    stored = [k for k in s3_server.keys(on_server.bucket, "artifacts/") if champion.run_id in k]
    assert any(k.endswith("/model.safetensors") for k in stored), f"artifacts did not go through the server to S3: {stored}"
    assert c.search_registered_models(f"name LIKE '{name}.%'") == [], "the champion lock was left behind"
    assert c.get_experiment_by_name(name).tags["mlflow.experimentKind"] == "custom_model_development"  # runs view

    proc = cli("generate", f"models:/{name}@champion", "--prompt", "def ", "--max-new-tokens", "16")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("def ") and len(proc.stdout) > len("def ") + 8
    folder = home / "cache" / "models" / f"{name}-v2"
    assert (folder / "model.safetensors").is_file()

    # the champion as anyone loads it: transformers reads the folder as it is and generates greedily the
    # tokens Taxiway's sampler does; `mlflow models serve` answers a prompt
    _transformers_generates_what_taxiway_does(folder, "def ", 16)
    with served(f"models:/{name}@champion", on_server.uri, home / "serve.log") as url:
        answer = httpx.post(f"{url}/invocations", json={"inputs": ["def "], "params": {"max_new_tokens": 8}},
                            timeout=120)
    assert answer.status_code == 200, answer.text
    (text,) = answer.json()["predictions"]
    assert isinstance(text, str) and text.strip(), answer.json()


def _transformers_generates_what_taxiway_does(folder: Path, prompt: str, n: int) -> None:
    import torch
    import transformers

    from eval.generate import sample
    from eval.model_files import load_model
    from pipelines.tokenize import bpe

    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    ids = tok(prompt)["input_ids"]
    assert ids == bpe.load(folder / "tokenizer.json", tok.eos_token).encode(prompt).ids
    want = sample(load_model(folder)[0], ids, n, temperature=0, eos_id=tok.eos_token_id)
    with torch.no_grad():
        got = hf.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False)[0, len(ids):].tolist()
    assert got in (want, [*want, tok.eos_token_id]), (got, want)
