"""The locks that serialize champion moves, each against real contenders (separate processes released
together at a barrier, ``ROUNDS`` times over): a file lock (SQLite stores), PostgreSQL's advisory lock,
and the registry lock (any other store: a lease kept as a registered model); a holder that dies;
and two promotions at the same instant, of which exactly one moves the champion."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from contenders import BARRIER, all_succeed
from postgres import pg_uri

from conftest import REPO


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


ROUNDS = 10  # each race is run this many times in one test, every contender at the gate together

_HOLDER = BARRIER + textwrap.dedent("""
    import json, sys, time
    from pipelines.registry import client, locks
    from pipelines.run_folder import mlflow_tracking_uri
    kind, key, log, hold, folder, me, n, rounds = sys.argv[1:9]
    def lock():
        if kind == "file":
            return locks.file_lock(pathlib.Path(key), 60)
        if kind == "advisory":
            return locks.advisory_lock(mlflow_tracking_uri(), key, 60)
        return locks.registry_lock(client(), key, 60)
    for rnd in range(int(rounds)):
        barrier(folder, rnd, me, int(n))
        with lock():
            start = time.time()
            print("held", flush=True)
            time.sleep(float(hold))
            with open(log, "a") as fh:
                fh.write(json.dumps([start, time.time()]) + "\\n")
""")


def _holders(kind: str, key: str, log: Path, folder: Path, hold: float = 0.02, n: int = 2,
             rounds: int = ROUNDS) -> list[subprocess.Popen]:
    folder.mkdir(exist_ok=True)
    return [subprocess.Popen([sys.executable, "-c", _HOLDER, kind, key, str(log), str(hold), str(folder), str(i),
                              str(n), str(rounds)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for i in range(n)]


@pytest.mark.parametrize("kind", ["file", "advisory", "registry"])
def test_champion_locks_exclude_each_other_and_survive_a_dead_holder(kind, home: Path, tmp_path: Path, monkeypatch,
                                                                     request):
    from pipelines.registry import client, locks

    if kind == "advisory":
        monkeypatch.setenv("MLFLOW_TRACKING_URI", pg_uri(request.getfixturevalue("postgres_db")))
    else:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{home / 'registry-tests.db'}")
    if kind == "registry":  # create the schema first: two holders migrating one new SQLite file collide
        client().search_registered_models(max_results=1)
    key = str(tmp_path / "champion.lock") if kind == "file" else _unique("lock")
    log = tmp_path / "held.jsonl"
    all_succeed(_holders(kind, key, log, tmp_path / "barrier"))
    spans = sorted(json.loads(line) for line in log.read_text().splitlines())
    assert len(spans) == 2 * ROUNDS
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False)), f"overlapping holds: {spans}"

    # a holder killed while holding: the next process gets the lock within its own timeout (30 s),
    # well before the dead holder's hold (60 s) would have ended
    (dead,) = _holders(kind, key, tmp_path / "dead.jsonl", tmp_path / "dead-barrier", hold=60, n=1, rounds=1)
    assert dead.stdout.readline().strip() == "held"
    dead.kill()
    dead.wait()
    if kind == "registry":  # no database to notice the death: the lease runs out instead
        client().set_registered_model_tag(key, "expires_ms", str(int((time.time() + 1.0) * 1000)))
    lock = {"file": lambda: locks.file_lock(Path(key), 30),
            "advisory": lambda: locks.advisory_lock(os.environ["MLFLOW_TRACKING_URI"], key, 30),
            "registry": lambda: locks.registry_lock(client(), key, 30)}[kind]
    with lock():
        pass
    if kind == "registry":
        from mlflow.exceptions import MlflowException

        with pytest.raises(MlflowException):
            client().get_registered_model(key)  # released: the mutex model is gone again


def test_registry_lock_breaks_a_dead_breakers_token_and_a_stale_lease_deletes_nothing(home: Path, monkeypatch):
    """The corners of breaking a lease (the race itself: tests/test_registry_server.py): a break
    token left by a breaker that died mid-break is broken in turn, after its own lease; a breaker
    that read a lease since replaced (its holder gone, never to come back) deletes nothing."""
    from pipelines.registry import client, locks

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{home / 'registry-tests.db'}")
    c, key = client(), _unique("lock")
    dead = locks._take(c, key, "dead-holder", -1.0)
    locks._take(c, locks._break_token(key, dead.holder), "dead-breaker", -1.0)
    with locks.registry_lock(c, key, 30):
        assert c.get_registered_model(key).tags["holder"] != "dead-holder"
        assert not locks._delete_held(c, key, "dead-holder", expired_only=True)
        assert not locks._delete_held(c, key, "dead-holder", expired_only=False)
    assert c.search_registered_models(f"name LIKE '{key}%'") == [], "a lock or a break token was left behind"


_PROMOTER = BARRIER + textwrap.dedent("""
    import json, sys
    from pipelines.config import RegistryConfig
    from pipelines.registry import champion
    prefix, version, folder, me, n, rounds, out = sys.argv[1:8]
    report = {"passed": True, "reason": f"version {version} beat the floor", "baseline": {"kind": "floor"}}
    for rnd in range(int(rounds)):
        reg = RegistryConfig(model_name=f"{prefix}-{rnd}", lock_timeout_s=120, retry_backoff_s=0.2)
        barrier(folder, rnd, me, int(n))
        outcome = champion.promote(reg, version, report)
        with open(out, "a") as fh:
            fh.write(json.dumps({"round": rnd, "version": version, "alias": getattr(outcome, "alias", None),
                                 "found": getattr(outcome, "found", None)}) + "\\n")
""")


def test_two_promotions_at_the_same_instant_move_the_champion_once(home: Path, tmp_path: Path, monkeypatch,
                                                                   postgres_db):
    """Two versions, both having beaten the floor, try to become champion at the same instant, 10
    times over: each time exactly one wins; the other finds the champion moved (to the winner) and
    moves nothing. A compare-and-set without its lock lets both win."""
    from pipelines.registry import client

    monkeypatch.setenv("MLFLOW_TRACKING_URI", pg_uri(postgres_db))  # the production store
    prefix, c = _unique("cas"), client()
    for rnd in range(ROUNDS):
        c.create_registered_model(f"{prefix}-{rnd}")
        for _ in range(2):
            c.create_model_version(f"{prefix}-{rnd}", source=str(tmp_path))
    out = tmp_path / "outcomes.jsonl"
    (tmp_path / "barrier").mkdir()
    procs = [subprocess.Popen([sys.executable, "-c", _PROMOTER, prefix, str(v), str(tmp_path / "barrier"), str(v), "2",
                               str(ROUNDS), str(out)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for v in (1, 2)]
    all_succeed(procs)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2 * ROUNDS
    for rnd in range(ROUNDS):
        pair = sorted((r for r in rows if r["round"] == rnd), key=lambda r: r["alias"] is None)
        winner, loser = pair
        assert winner["alias"] == "champion" and loser["alias"] is None, pair
        assert loser["found"] == winner["version"], pair  # it saw the winner, and moved nothing
        assert str(c.get_model_version_by_alias(f"{prefix}-{rnd}", "champion").version) == winner["version"]
