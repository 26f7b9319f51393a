"""The batches page's facts (``pipelines.refresh.batches``): every landed batch's state against the
champion, on real files in the test's own landing zone and a champion in its own MLflow store
(SQLite) whose ledger is the artifact a refresh logs; a quarantined batch released, recorded, and
tried again by the next refresh's plan."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from conftest import TINY

NAME = "taxiway-tiny-gpt"


def _source(root: Path, texts: dict[str, str]) -> Path:
    (root / "train").mkdir(parents=True)
    for name, text in texts.items():
        (root / "train" / name).write_text(text)
    return root


def land_texts(home: Path, root: Path, batch_id: str, texts: dict[str, str]):
    from pipelines.refresh import landing

    return landing.land(_source(root, texts), home / "landing", batch_id=batch_id)


def land_by_hand(home: Path, batch_id: str, files: dict[str, bytes]) -> None:
    """A batch another system landed: files, manifest and marker written without the door's check."""
    folder = home / "landing" / batch_id
    lines = []
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
        lines.append(json.dumps({"path": rel, "split": "train", "bytes": len(data),
                                 "sha256": hashlib.sha256(data).hexdigest()}))
    text = "\n".join(lines) + "\n"
    (folder / "manifest.jsonl").write_text(text)
    (folder / "_COMPLETE").write_text(json.dumps({
        "batch_id": batch_id, "manifest_sha256": hashlib.sha256(text.encode()).hexdigest(), "files": len(files),
        "bytes": sum(map(len, files.values())), "landed_at": "2026-12-05T01:00:00.000Z"}))


def champion_with_ledger(tmp_path: Path, trained: list) -> str:
    """Version 1 of the model, champion, with the ledger a refresh that trained ``trained`` logs."""
    from pipelines.refresh.ledger import ARTIFACT, Ledger
    from pipelines.registry import client

    c = client()
    run = c.create_run(c.create_experiment("batches")).info.run_id
    ledger = tmp_path / "ledger" / Path(ARTIFACT).name
    ledger.parent.mkdir()
    ledger.write_text(Ledger().extended(trained, "1").to_json())
    c.log_artifact(run, str(ledger), artifact_path=str(Path(ARTIFACT).parent))
    c.create_registered_model(NAME)
    mv = c.create_model_version(NAME, c.get_run(run).info.artifact_uri + "/model", run_id=run)
    c.set_registered_model_alias(NAME, "champion", mv.version)
    return f"models:/{NAME}/{mv.version}"


@pytest.fixture
def cfg():
    from pipelines.config import load_config

    return load_config(TINY)


def _rows(cfg) -> dict:
    from pipelines.refresh import batches

    return {r.id: r for r in batches.listing(cfg).batches}


def test_each_landed_batch_has_its_state_against_the_champion(home: Path, tmp_path: Path, cfg):
    from pipelines.refresh import attempts, batches
    from pipelines.run_folder import RunFolder, run_dir
    from trainer import fsio

    trained = land_texts(home, tmp_path / "t", "trained", {"a.txt": "first document\n", "b.txt": "second one\n"})
    champion = champion_with_ledger(tmp_path, [trained])
    land_texts(home, tmp_path / "t-again", "again", {"a.txt": "first document\n", "b.txt": "second one\n"})
    land_texts(home, tmp_path / "n", "waiting", {"c.txt": "a new document\n"})
    land_texts(home, tmp_path / "m", "edited", {"d.txt": "will be edited\n"})
    (home / "landing" / "edited" / "manifest.jsonl").write_text("")  # the manifest changed after landing
    land_texts(home, tmp_path / "f", "grown", {"e.txt": "will grow\n"})
    (home / "landing" / "grown" / "train" / "e.txt").write_text("will grow, and did\n")
    land_by_hand(home, "unreadable", {"train/x.txt": b"caf\xe9\n", "train/y.py": b"print(1)\n"})
    (home / "landing" / "broken").mkdir()
    (home / "landing" / "broken" / "_COMPLETE").write_text("not json")
    bad = land_texts(home, tmp_path / "q", "bad", {"f.txt": "keeps failing\n"})
    for run in ("r1", "r2", "r3"):  # three refreshes tried it and failed (refresh.max_attempts is 3)
        attempts.take([bad], run, champion, cfg.refresh.max_attempts)
    fsio.write_json(RunFolder(run_dir(batches.REFRESH_DAG, "r3")).failure_summary,
                    {"stage": "preflight", "task_id": "preflight.gate", "reason": "f.txt leaks val", "next": "fix it"})

    listing = batches.listing(cfg)
    rows = {r.id: r for r in listing.batches}
    assert listing.champion == champion and listing.total == len(rows) == 8
    assert {k: r.state for k, r in rows.items()} == {
        "trained": "trained", "again": "re-sent", "waiting": "new", "edited": "changed", "grown": "changed",
        "unreadable": "invalid", "broken": "invalid", "bad": "quarantined"}
    assert rows["trained"].trained_by == champion and rows["trained"].files == 2
    assert rows["trained"].bytes == len("first document\n") + len("second one\n")
    assert rows["again"].reason == "same manifest as trained batch trained"
    assert "changed after landing" in rows["edited"].reason
    assert rows["grown"].reason.startswith("changed after landing: train/e.txt (19 bytes, the manifest says 10)")
    assert "train/x.txt (invalid UTF-8 at byte 3)" in rows["unreadable"].reason and "train/y.py" in rows["unreadable"].reason
    assert "not a JSON batch marker" in rows["broken"].reason and rows["broken"].landed_at is None
    assert rows["bad"].attempts == ("r1", "r2", "r3")
    assert rows["bad"].last_failure == {"run_id": "r3", "stage": "preflight", "task_id": "preflight.gate",
                                        "reason": "f.txt leaks val", "next": "fix it"}
    assert rows["waiting"].reason == f"waiting for the next refresh of {champion}"
    # newest first, landing times as the markers recorded them (UTC ISO 8601)
    times = [r.landed_at for r in listing.batches if r.landed_at]
    assert times == sorted(times, reverse=True) and all(t.endswith("Z") for t in times)
    assert [r.id for r in batches.listing(cfg, limit=2).batches] == [r.id for r in listing.batches[:2]]
    assert json.loads(json.dumps(listing.to_json()))["batches"][0]["id"] == listing.batches[0].id


def test_a_re_sent_batch_of_trained_documents_is_re_sent(home: Path, tmp_path: Path, cfg):
    """A batch whose every document repeats trained data (found by a refresh's assemble, kept in
    ``repeats.json``) is a re-send for the page too."""
    from pipelines.refresh import attempts

    champion = champion_with_ledger(tmp_path, [])
    renamed = land_texts(home, tmp_path / "r", "renamed", {"z.txt": "seen before\n"})
    assert _rows(cfg)["renamed"].state == "new"
    attempts.record_repeat(renamed, champion, "every train document repeats trained data")
    row = _rows(cfg)["renamed"]
    assert (row.state, row.reason) == ("re-sent", "every train document repeats trained data")


def test_without_a_champion_every_readable_batch_waits_for_one(home: Path, tmp_path: Path, cfg):
    from pipelines.refresh import batches

    land_texts(home, tmp_path / "n", "first", {"a.txt": "a document\n"})
    listing = batches.listing(cfg)
    assert listing.champion is None
    (row,) = listing.batches
    assert row.state == "new" and row.reason.startswith("waiting for a champion")
    assert batches.listing(cfg.model_copy(update={"refresh": cfg.refresh.model_copy(
        update={"landing": None})})).batches == ()
    # the listing pages: every batch is reachable, newest first, a page at a time
    for name in ("second", "third"):
        land_texts(home, tmp_path / name, name, {"a.txt": f"{name} document\n"})
    pages = [batches.listing(cfg, limit=2, page=p) for p in range(3)]
    assert [[r.id for r in p.batches] for p in pages] == [["third", "second"], ["first"], []]
    assert {(p.total, p.limit) for p in pages} == {(3, 2)} and pages[1].to_json()["page"] == 1
    from taxiway_airflow.runs_view import render

    html = render.batches_page(pages[1], "/taxiway")
    assert "3–3 of 3" in html and "/taxiway/batches?page=0" in html and "page=2" not in html


def test_a_released_batch_is_recorded_and_tried_again_by_the_next_refresh(home: Path, tmp_path: Path, cfg):
    from pipelines.refresh import attempts, batches

    champion = champion_with_ledger(tmp_path, [])
    bad = land_texts(home, tmp_path / "q", "bad", {"f.txt": "keeps failing\n"})
    land_texts(home, tmp_path / "n", "fine", {"g.txt": "fine document\n"})
    for run in ("r1", "r2", "r3"):
        attempts.take([bad], run, champion, 3)
    assert attempts.take([bad], "r4", champion, 3).quarantined == [(bad, ["r1", "r2", "r3"])]

    with pytest.raises(attempts.NotQuarantined, match="batch fine is new, not quarantined: waiting"):
        batches.release(cfg, "fine", "alice")
    with pytest.raises(batches.UnknownBatch, match="no batch of that id"):
        batches.release(cfg, "nothing-here", "alice")
    with pytest.raises(batches.UnknownBatch, match="not a batch id"):
        batches.release(cfg, "../bad", "alice")

    record = batches.release(cfg, "bad", "alice")
    assert record["by"] == "alice" and record["champion"] == champion and record["attempts"] == ["r1", "r2", "r3"]
    assert record["at"].endswith("Z")
    row = _rows(cfg)["bad"]
    assert row.state == "new" and row.attempts == () and row.releases == (record,)
    with pytest.raises(attempts.NotQuarantined, match="batch bad is new"):
        batches.release(cfg, "bad", "bob")  # released once: nothing to release again
    taken = attempts.take([bad], "r5", champion, 3)
    assert taken.kept == [bad] and taken.quarantined == []  # the next refresh tries it again
