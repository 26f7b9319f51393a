"""The landing zone contract (a batch exists for readers only once its marker is written, last),
the ledger of batches a version was trained on, and what is new since the champion."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, in_task, taxiway
from pipelines import manifest, storage
from pipelines.errors import BadInput
from pipelines.refresh import landing


def _source(root: Path, docs: int = 3, val: bool = True) -> Path:
    for i in range(docs):
        (root / "train").mkdir(parents=True, exist_ok=True)
        (root / "train" / f"doc{i}.txt").write_text(f"new training document {i}\n" * 20)
    if val:
        (root / "val").mkdir(parents=True, exist_ok=True)
        (root / "val" / "v0.txt").write_text("a new held-out document\n" * 20)
    return root


def test_a_landed_batch_is_complete_with_its_manifest(tmp_path: Path):
    src = _source(tmp_path / "src")
    batch = landing.land(src, tmp_path / "landing", batch_id="b1")
    assert landing.complete_batches(tmp_path / "landing") == [batch]
    entries = manifest.read(batch.manifest)
    assert {(e.split, e.path) for e in entries} == {("train", f"train/doc{i}.txt") for i in range(3)} | {("val", "val/v0.txt")}
    assert batch.files == 4 and batch.bytes == sum(e.bytes for e in entries)
    assert batch.manifest_sha256 == manifest.digest(batch.manifest)
    assert batch.landed_at.endswith("Z")


def test_a_batch_without_its_marker_is_never_read(tmp_path: Path):
    zone = tmp_path / "landing"
    landing.land(_source(tmp_path / "src"), zone, batch_id="b1")
    half = zone / "b2"  # a copy under way (or interrupted): files and manifest, no marker yet
    (half / "train").mkdir(parents=True)
    (half / "train" / "x.txt").write_text("half")
    (half / "manifest.jsonl").write_text("")
    (zone / ".b3.1234.tmp").mkdir()  # a local lander's staging folder
    assert [b.id for b in landing.complete_batches(zone)] == ["b1"]
    with pytest.raises(landing.LandingError, match="b2: exists without its _COMPLETE marker"):
        landing.land(_source(tmp_path / "src2"), zone, batch_id="b2")


def test_landing_an_id_twice_is_refused_and_a_changed_manifest_is_caught(tmp_path: Path):
    zone = tmp_path / "landing"
    batch = landing.land(_source(tmp_path / "src"), zone, batch_id="b1")
    with pytest.raises(landing.LandingError, match="batch b1 already exists"):
        landing.land(_source(tmp_path / "src"), zone, batch_id="b1")
    Path(batch.manifest).write_text(Path(batch.manifest).read_text().replace("doc0", "doc9"))
    with pytest.raises(landing.LandingError, match=r"b1/manifest.jsonl: changed after landing"):
        landing.complete_batches(zone)


@pytest.mark.parametrize(("make", "message"), [
    (lambda root: _source(root, docs=0, val=True), "needs a train/ folder"),
    (lambda root: ((root / "train").mkdir(parents=True), _source(root, docs=0, val=True)), "train/ holds no files"),
    (lambda root: (_source(root), (root / "notes.md").write_text("x")), "unexpected notes.md"),
    (lambda root: (_source(root, val=False), (root / "val").write_text("x")), r"refused val \(a file, not a folder\)"),
])
def test_a_source_that_is_no_batch_is_refused_naming_why(tmp_path: Path, make, message):
    make(tmp_path / "src")
    with pytest.raises(landing.LandingError, match=message):
        landing.land(tmp_path / "src", tmp_path / "landing")
    assert not (tmp_path / "landing").exists() or not any((tmp_path / "landing").iterdir())


def test_batches_come_in_landing_order_and_bad_markers_name_the_field(tmp_path: Path):
    zone = tmp_path / "landing"
    for i in ("z-first", "a-second"):
        landing.land(_source(tmp_path / f"src-{i}"), zone, batch_id=i)
    assert [b.id for b in landing.complete_batches(zone)] == ["z-first", "a-second"]
    marker = zone / "a-second" / "_COMPLETE"
    good = json.loads(marker.read_text())
    marker.write_text(json.dumps({k: v for k, v in good.items() if k != "bytes"}))
    with pytest.raises(landing.LandingError, match=r"a-second/_COMPLETE: field bytes missing or not a int"):
        landing.complete_batches(zone)
    marker.write_bytes(b"\xff not json")
    with pytest.raises(landing.LandingError, match=r"a-second/_COMPLETE: not a JSON batch marker"):
        landing.complete_batches(zone)


def test_a_source_manifest_must_match_its_files(tmp_path: Path):
    src = _source(tmp_path / "src")
    manifest.write(src / "manifest.jsonl", manifest.scan(src))
    assert landing.land(src, tmp_path / "landing", batch_id="ok").files == 4
    (src / "train" / "doc1.txt").write_text("changed after the manifest was written\n")
    with pytest.raises(landing.LandingError, match=r"manifest.jsonl: train/doc1.txt differs from the file"):
        landing.land(src, tmp_path / "landing", batch_id="bad")
    assert [b.id for b in landing.complete_batches(tmp_path / "landing")] == ["ok"]


@pytest.mark.parametrize("bad", ["", ".hidden", "a/b", "x" * 129, "sp ace", "nl\n"])
def test_batch_ids_are_plain_names(tmp_path: Path, bad: str):
    with pytest.raises(landing.LandingError, match="batch id"):
        landing.land(_source(tmp_path / "src"), tmp_path / "landing", batch_id=bad)


def test_a_landing_zone_on_s3_works_the_same(tmp_path: Path, monkeypatch):
    """Object storage through fsspec (s3fs), against the tests' own S3 API server (deploy/local/s3_server.py):
    what lands is listed, complete, and reads back byte for byte; a batch id is still taken once."""
    import s3_server

    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    bucket = s3_server.bucket()
    zone = f"s3://{bucket}/landing"
    src = _source(tmp_path / "src")
    batch = landing.land(src, zone, batch_id="b1")
    assert batch.uri == f"{zone}/b1" and landing.complete_batches(zone) == [batch]
    entries = manifest.read(batch.manifest)
    assert sorted(s3_server.keys(bucket)) == sorted(
        [f"landing/b1/{name}" for name in (landing.MARKER, landing.MANIFEST)] + [f"landing/b1/{e.path}" for e in entries])
    assert all(storage.read_bytes(storage.locate(f"{batch.uri}/{e.path}")) == (src / e.path).read_bytes() for e in entries)
    with pytest.raises(landing.LandingError, match="b1"):
        landing.land(src, zone, batch_id="b1")


@pytest.mark.parametrize(("name", "content", "why"), [
    ("notes.py", b"print('a source file')\n", "cannot infer format from extension '.py'"),
    ("latin1.txt", "caf\xe9 au lait\n".encode("latin-1"), "invalid UTF-8 at byte 3"),
    ("blob.txt", b"\x00\x01\x02", "binary content (NUL bytes)"),
    ("docs.jsonl", b'{"text": "fine"}\nnot json\n', "not valid JSON"),
    ("docs.jsonl", b'{"body": "no text field"}\n', "no string field 'text'"),
    ("table.parquet", b"PAR1 but not really", "not a readable parquet file"),
])
def test_a_batch_the_pipeline_cannot_read_never_lands(tmp_path: Path, name: str, content: bytes, why: str):
    """Checked at the door (issue 35): every file is read as the preflight and the tokenizer would
    read it; each unreadable one is named with its reason, and nothing is copied."""
    src = _source(tmp_path / "src")
    (src / "train" / name).write_bytes(content)
    with pytest.raises(landing.LandingError, match=r"refused train/" + re.escape(f"{name} ({why}")) as err:
        landing.land(src, tmp_path / "landing", batch_id="b1")
    assert "nothing landed" in str(err.value) and "doc0.txt" not in str(err.value)
    assert not (tmp_path / "landing").exists() or not any((tmp_path / "landing").iterdir())


def test_the_deployments_data_format_reads_files_whatever_their_extension(tmp_path: Path):
    src = _source(tmp_path / "src", val=False)
    for path in (src / "train").iterdir():
        path.rename(path.with_suffix(".json"))
        path.with_suffix(".json").write_text(json.dumps({"text": "a document"}) + "\n")
    with pytest.raises(landing.LandingError, match=r"cannot infer format from extension '.json'"):
        landing.land(src, tmp_path / "landing", batch_id="b1")
    assert landing.land(src, tmp_path / "landing", batch_id="b1", fmt="jsonl").files == 3


def test_a_batch_another_system_landed_is_judged_at_the_refreshs_door(home: Path, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch):
    """A batch landed around ``taxiway land`` (here: its door check switched off, as another system's
    lander has none) with a file the pipeline cannot read is invalid in the refresh's plan, named with
    the file, and never taken as an attempt; the readable batch beside it is refreshed on."""
    from conftest import TINY
    from pipelines import registry
    from pipelines.config import load_config
    from pipelines.refresh import attempts
    from pipelines.refresh import ledger as ledgers
    from pipelines.stages.refresh import plan as decide

    zone = tmp_path / "landing"
    (good,) = _batches(zone, tmp_path, "good")
    src = _source(tmp_path / "src-other")
    (src / "train" / "notes.py").write_text("print('not a document')\n")
    with monkeypatch.context() as m:
        m.setattr(landing, "unreadable", lambda *args, **kwargs: [])
        landing.land(src, zone, batch_id="other")
    cfg = load_config(TINY, [f"refresh.landing={zone}"])
    c, name = registry.client(), cfg.registry.model_name  # a champion trained on no batch yet
    run = c.create_run(c.create_experiment("refresh")).info.run_id
    (tmp_path / "ledger.json").write_text(ledgers.Ledger(base={"train": "/t", "val": "/v", "manifest": "/m.jsonl",
                                                                "format": "txt"}).to_json())
    c.log_artifact(run, str(tmp_path / "ledger.json"), "refresh")
    c.create_registered_model(name)
    c.set_registered_model_alias(name, cfg.registry.champion_alias,
                                 c.create_model_version(name, f"runs:/{run}/model", run_id=run).version)

    decision = decide(cfg, tmp_path / "run0", "run0")
    written = json.loads((tmp_path / "run0" / "refresh" / "plan.json").read_text())
    assert [b["id"] for b in written["new"]] == ["good"] and decision.config is not None
    assert written["invalid"] == [{"folder": "other", "reason": "unreadable train/notes.py (cannot infer format from "
                                                                  "extension '.py' (expected one of .txt, .jsonl, .parquet; "
                                                                  "or set data.format))"}]
    assert "other invalid: unreadable train/notes.py" in written["reason"]
    assert "other" not in attempts.path().read_text() and "good" in attempts.path().read_text()


def test_cli_land_prints_the_batch_and_refuses_bad_input(home: Path, tmp_path: Path):
    zone = tmp_path / "landing"
    out = taxiway("land", str(_source(tmp_path / "src")), "--landing", str(zone), "--batch-id", "b1", check=True)
    marker = json.loads((zone / "b1" / "_COMPLETE").read_text())
    assert marker["batch_id"] == "b1" and out.stdout.strip().splitlines()[-1] == str(zone / "b1" / "_COMPLETE")
    again = taxiway("land", str(tmp_path / "src"), "--landing", str(zone), "--batch-id", "b1")
    assert again.returncode == 2 and "already exists" in again.stderr and "Traceback" not in again.stderr
    default = taxiway("land", str(tmp_path / "src"), check=True)  # refresh.landing of $TAXIWAY_CONFIG
    assert [b.id for b in landing.complete_batches(home / "landing")] == [default.stdout.split()[2].rstrip(":")]


def test_cli_land_says_when_it_could_not_announce_the_batch(home: Path, tmp_path: Path):
    """Announcing is configured from the environment; a batch that landed but was not announced is
    said so (exit 3: the cron still finds it), credentials missing is bad input (exit 2)."""
    src, zone = _source(tmp_path / "src"), tmp_path / "landing"
    no_creds = taxiway("land", str(src), "--landing", str(zone), "--batch-id", "b1",
                       env={"TAXIWAY_AIRFLOW_URL": "http://127.0.0.1:1"})
    assert no_creds.returncode == 2 and "set TAXIWAY_AIRFLOW_TOKEN, or TAXIWAY_AIRFLOW_USERNAME and" in no_creds.stderr
    away = taxiway("land", str(src), "--landing", str(zone), "--batch-id", "b2",
                   env={"TAXIWAY_AIRFLOW_URL": "http://127.0.0.1:1", "TAXIWAY_AIRFLOW_TOKEN": "t"})
    assert away.returncode == 3 and "batch b2 landed, but could not reach Airflow at http://127.0.0.1:1" in away.stderr
    assert "the refresh's cron will find it" in away.stderr and "Traceback" not in away.stderr
    assert [b.id for b in landing.complete_batches(zone)] == ["b2"]  # without credentials nothing landed


def _batches(zone: Path, tmp_path: Path, *ids: str) -> list[landing.Batch]:
    return [landing.land(_source(tmp_path / f"src-{i}", docs=2 + n), zone, batch_id=i) for n, i in enumerate(ids)]


def test_the_ledger_plans_new_batches_and_drops_resent_ones(tmp_path: Path):
    from pipelines.refresh.ledger import Ledger

    zone = tmp_path / "landing"
    b1, b2 = _batches(zone, tmp_path, "b1", "b2")
    resent = landing.land(tmp_path / "src-b1", zone, batch_id="b1-again")  # the same files under another id
    plan = Ledger().triage(landing.complete_batches(zone))
    assert [b.id for b in plan.new] == ["b1", "b2"] and [(b.id, twin) for b, twin in plan.resent] == [("b1-again", "b1")]
    ledger = Ledger().extended(plan.new, "3")
    assert [b["id"] for b in ledger.batches] == ["b1", "b2"] and {b["version"] for b in ledger.batches} == {"3"}
    assert Ledger.from_json(ledger.to_json().encode(), "x") == ledger
    again = ledger.triage(landing.complete_batches(zone))
    assert again.new == [] and [b.id for b, _ in again.resent] == ["b1-again"]
    assert "b1-again dropped: same manifest as already trained batch b1" in again.summary()
    relanded = Ledger(({**b2.ref(), "manifest_sha256": "0" * 64, "version": "2"},)).triage([b2])
    assert relanded.new == [] and relanded.changed == [b2] and "b2 skipped: trained before" in relanded.summary()
    assert resent.manifest_sha256 == b1.manifest_sha256 != b2.manifest_sha256


def test_a_versions_ledger_is_read_from_the_registry_alone(tmp_path: Path):
    """A version with ``refresh/ledger.json`` on its run answers which batches it was trained on and
    the corpus its lineage started from; one without (trained from scratch) has no batches and its own
    training data (its run's ``data.*`` params) as base; a damaged ledger names the version."""
    from pipelines import registry
    from pipelines.refresh import ledger as ledgers

    c = registry.client()
    zone = tmp_path / "landing"
    (b1,) = _batches(zone, tmp_path, "b1")
    c.create_registered_model("m")
    versions = []
    base = {"train": "/corpus/train", "val": "/corpus/val", "manifest": "/corpus/manifest.jsonl", "format": None}
    for text in (None, ledgers.Ledger(base=base).extended([b1], "2").to_json(), "{not json"):
        run = c.create_run(c.create_experiment(f"e{len(versions)}")).info.run_id
        if text is None:
            for key, value in base.items():
                c.log_param(run, f"data.{key}", str(value))
        else:
            (tmp_path / "ledger.json").write_text(text)
            c.log_artifact(run, str(tmp_path / "ledger.json"), "refresh")
        versions.append(c.create_model_version("m", f"runs:/{run}/model", run_id=run))
    assert ledgers.of_version(c, versions[0], tmp_path / "d0") == ledgers.Ledger(base=base)
    refreshed = ledgers.of_version(c, versions[1], tmp_path / "d1")
    assert [b["id"] for b in refreshed.batches] == ["b1"] and refreshed.base == base
    with pytest.raises(ledgers.LedgerError, match="models:/m/3 refresh/ledger.json: not a Taxiway ledger"):
        ledgers.of_version(c, versions[2], tmp_path / "d2")


def test_what_is_new_is_decided_against_the_champions_ledger(tmp_path: Path):
    from conftest import TINY
    from pipelines import registry
    from pipelines.config import load_config
    from pipelines.refresh import ledger as ledgers
    from pipelines.stages.refresh import plan as decide

    zone = tmp_path / "landing"
    b1, b2 = _batches(zone, tmp_path, "b1", "b2")
    landing.land(tmp_path / "src-b1", zone, batch_id="b1-again")
    cfg = load_config(TINY, [f"refresh.landing={zone}"])
    decision = decide(cfg, tmp_path / "run0", "run0")
    assert decision.config is None and "no version of taxiway-tiny-gpt holds 'champion'" in decision.reason
    written = json.loads((tmp_path / "run0" / "refresh" / "plan.json").read_text())
    assert written["champion"] is None and [b["id"] for b in written["new"]] == ["b1", "b2"]

    c, name = registry.client(), cfg.registry.model_name
    run = c.create_run(c.create_experiment("refresh")).info.run_id
    base = {"train": "/lineage/train", "val": "/lineage/val", "manifest": "/lineage/manifest.jsonl", "format": "txt"}
    (tmp_path / "ledger.json").write_text(ledgers.Ledger(base=base).extended([b1], "1").to_json())
    c.log_artifact(run, str(tmp_path / "ledger.json"), "refresh")
    c.create_registered_model(name)
    mv = c.create_model_version(name, f"runs:/{run}/model", run_id=run)
    c.set_registered_model_alias(name, cfg.registry.champion_alias, mv.version)

    decision = decide(cfg, tmp_path / "run1", "run1")
    champion = f"models:/{name}/{mv.version}"
    assert decision.config.parent == champion and decision.reason.startswith(f"refreshing {champion} on b2: ")
    written = json.loads((tmp_path / "run1" / "refresh" / "plan.json").read_text())
    assert [b["id"] for b in written["new"]] == ["b2"] and written["resent"][0]["repeats"] == "b1"
    assert "b1-again dropped: same manifest as already trained batch b1" in written["reason"]
    assert written["base_data"] == base  # the lineage's corpus, not the deployment config's data section
    assert decision.config.data.manifest == str(tmp_path / "run1" / "refresh" / "data" / "manifest.jsonl")
    assert decision.config.train.steps == cfg.refresh.steps and decision.config.train.rewarmup_steps == cfg.refresh.warmup_steps

    with pytest.raises(BadInput, match="refresh.landing: not set"):
        decide(load_config(TINY, ["refresh.landing=null"]), tmp_path / "run2", "run2")


def test_a_failing_batch_is_tried_alone_and_quarantined_without_the_healthy_ones(home: Path, tmp_path: Path):
    from pipelines.refresh import attempts

    zone = tmp_path / "landing"
    good, bad, later = _batches(zone, tmp_path, "good", "bad", "later")
    first = attempts.take([good, bad], "run-1", "models:/m/1", 2)  # both new: tried together, and fail
    assert (first.kept, first.held, first.quarantined) == ([good, bad], [], [])
    assert attempts.take([good, bad], "run-1", "models:/m/1", 2) == first  # a retry of the same run counts once
    second = attempts.take([good, bad, later], "run-2", "models:/m/1", 2)  # what never failed goes first
    assert (second.kept, second.held) == ([later], [good, bad])
    third = attempts.take([good, bad], "run-3", "models:/m/1", 2)  # then each suspect alone: good passes
    assert (third.kept, third.held) == ([good], [bad])
    fourth = attempts.take([bad], "run-4", "models:/m/1", 2)  # bad alone, its second failure
    assert (fourth.kept, fourth.quarantined) == ([bad], [])
    fifth = attempts.take([bad], "run-5", "models:/m/1", 2)
    assert fifth.kept == [] and fifth.quarantined == [(bad, ["run-1", "run-4"])]
    assert attempts.take([bad], "run-6", "models:/m/2", 2).kept == [bad]  # a new champion: counts start afresh
    assert json.loads(attempts.path().read_text())[f"good {good.manifest_sha256} models:/m/1"] == ["run-1", "run-3"]


def test_an_invalid_batch_is_reported_and_the_others_go_on(tmp_path: Path):
    zone = tmp_path / "landing"
    b1, b2 = _batches(zone, tmp_path, "b1", "b2")
    Path(b1.manifest).write_text(Path(b1.manifest).read_text().replace("doc0", "doc9"))
    batches, invalid = landing.scan(zone)
    assert batches == [b2] and invalid[0][0] == "b1" and "b1/manifest.jsonl: changed after landing" in invalid[0][1]


def test_links_and_special_files_are_refused_before_anything_is_copied(tmp_path: Path):
    """A batch is regular files in real folders: a symlink (to a file, to a folder, or as train/
    itself) or a fifo would have the lander read what the folder does not hold, such as the worker's
    environment. Each one is named, by its name in the batch, and nothing lands."""
    src = _source(tmp_path / "src")
    elsewhere = _source(tmp_path / "elsewhere")
    (src / "train" / "env.txt").symlink_to("/proc/self/environ")
    (src / "train" / "sub").symlink_to(elsewhere / "train", target_is_directory=True)
    os.mkfifo(src / "val" / "pipe.txt")
    manifest.write(elsewhere / "manifest.jsonl", manifest.scan(elsewhere))
    (src / "manifest.jsonl").symlink_to(elsewhere / "manifest.jsonl")
    zone = tmp_path / "landing"
    with pytest.raises(landing.LandingError) as err:
        landing.land(src, zone, batch_id="b1")
    assert all(f"{name} ({why})" in str(err.value) for name, why in
               [("train/env.txt", "a symlink"), ("train/sub", "a symlink"), ("val/pipe.txt", "a fifo"),
                ("manifest.jsonl", "a symlink")]), err.value
    assert not zone.exists() or not any(zone.iterdir())
    only_train = tmp_path / "linked"
    only_train.mkdir()
    (only_train / "train").symlink_to(elsewhere / "train", target_is_directory=True)
    with pytest.raises(landing.LandingError, match=r"train \(a symlink\)"):
        landing.land(only_train, zone, batch_id="b2")
    secret = "TAXIWAY_TEST_SECRET=do-not-land"
    (src / "train" / "sub").unlink()
    (src / "val" / "pipe.txt").unlink()
    (src / "manifest.jsonl").unlink()
    proc = taxiway("land", str(src), "--landing", str(zone), "--batch-id", "b3", env={"TAXIWAY_TEST_SECRET": "do-not-land"})
    assert proc.returncode == 2 and "train/env.txt (a symlink)" in proc.stderr, proc.stderr
    assert secret not in proc.stdout + proc.stderr and "Traceback" not in proc.stderr
    assert not zone.exists() or not any(zone.iterdir())


_KILL_AT_MARKER = """
import os, signal, sys
from pipelines.refresh import landing

def crash(event, args):  # the process dies (SIGKILL) as it opens the batch's completion marker to write it
    if event == "open" and "_COMPLETE" in os.path.basename(str(args[0])) and args[1] not in ("r", "rb"):
        os.kill(os.getpid(), signal.SIGKILL)

sys.addaudithook(crash)
landing.land(sys.argv[1], sys.argv[2], batch_id="b1")
"""


def test_a_landing_killed_before_its_marker_leaves_the_id_free(tmp_path: Path):
    """The marker is written inside the staging folder and the rename into place commits the batch:
    a lander killed on its way leaves nothing under the batch's name, so the retry lands it."""
    src, zone = _source(tmp_path / "src"), tmp_path / "landing"
    crashed = subprocess.run([sys.executable, "-c", _KILL_AT_MARKER, str(src), str(zone)], cwd=REPO,
                             capture_output=True, text=True)
    assert crashed.returncode == -9, crashed.stderr
    assert landing.complete_batches(zone) == []
    batch = landing.land(src, zone, batch_id="b1")
    assert landing.complete_batches(zone) == [batch] and batch.files == 4


def test_only_a_batchs_own_data_counts_toward_its_quarantine(home: Path, tmp_path: Path):
    """Three refreshes shaped by a trigger's conf (``{"preflight": {"min_chars": 1000000}}``) once took a
    batch each and quarantined it. Now a run a trigger shaped records no attempt, and a failure that is
    not the batch's (a service, the machine, a limit) is excused; only a data failure counts."""
    from pipelines.refresh import attempts
    from taxiway_airflow import failure_summary

    (bad,) = _batches(tmp_path / "landing", tmp_path, "bad")
    champion = "models:/m/1"
    for run in ("shaped-1", "shaped-2", "shaped-3"):
        assert attempts.take([bad], run, champion, 1, record=False).kept == [bad]
    assert attempts.take([bad], "infra", champion, 1).kept == [bad]
    failure_summary.record(failure_summary.FailureSummary(
        dag_id="taxiway_refresh", run_id="infra", task_id="train.gang", stage="train", kind="transient failure (try again)",
        reason="the gang lost a node", next="-", run_folder=str(tmp_path / "run-infra"), at="2026-12-05T00:00:00+00:00"))
    assert attempts.take([bad], "data", champion, 1).kept == [bad]  # the infra failure was excused
    assert attempts.take([bad], "after", champion, 1).quarantined == [(bad, ["data"])]
    assert attempts.caused_by_data("preflight", "check failed") and attempts.caused_by_data("assemble", "bad input")
    assert not attempts.caused_by_data("train", "check failed")
    assert not attempts.caused_by_data("preflight", "transient failure (try again)")


def test_a_batch_and_the_landing_zone_are_bounded_by_the_deployments_limits(tmp_path: Path):
    from pipelines.config.limits import LimitsConfig

    zone, src = tmp_path / "landing", _source(tmp_path / "src", docs=3)  # 4 files, about 1,900 bytes
    for limits, why in ((LimitsConfig(batch_files=3), r"4 files, over limits.batch_files \(3\)"),
                        (LimitsConfig(batch_bytes=1000), r"\d+ bytes, over limits.batch_bytes \(1000\)")):
        with pytest.raises(landing.LandingError, match=why):
            landing.land(src, zone, batch_id="b", limits=limits)
        assert not zone.exists() or not any(zone.iterdir()), "nothing landed"
    landing.land(src, zone, batch_id="b1", limits=LimitsConfig(batches=1))
    with pytest.raises(landing.LandingError, match=r"holds 1 batches, limits.batches \(1\)"):
        landing.land(_source(tmp_path / "src2"), zone, batch_id="b2", limits=LimitsConfig(batches=1))


def test_taxiway_land_checks_its_conf_like_every_dags_first_task(airflow_db, tmp_path: Path, monkeypatch):
    """A run of taxiway_land made by any route (a materialized asset's conf reaches no guard's form) is
    checked by its task: unknown keys are refused, nothing lands."""
    from airflow.dag_processing.dagbag import DagBag
    from airflow.sdk.exceptions import AirflowFailException

    from pipelines.config import deployment
    from taxiway_airflow.tasks.land import land_batch

    dag = DagBag(dag_folder=str(REPO / "dags")).dags["taxiway_land"]
    src = _source(tmp_path / "src")
    monkeypatch.setenv("TAXIWAY_DATA_ROOTS", str(tmp_path))
    conf = {"source": str(src), "batch_id": "b1", "train": {"steps": 1}}
    dr = dag.test(run_conf=conf)
    assert str(dr.state) == "failed"
    with in_task("taxiway_land", "r", conf=conf), pytest.raises(AirflowFailException) as refused:
        land_batch.function(str(src), "b1")  # why it failed: the task's own callable on the same conf
    assert "train: not a conf key; expected source, batch_id" in str(refused.value)
    assert not (Path(deployment.config().refresh.landing) / "b1").exists()
