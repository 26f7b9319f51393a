"""Failure summaries: a failed ``taxiway_train`` run says where, why in one line and what to do next,
in ``failure.json``, the task log's last lines and the run's note (real Airflow, ``dag.test()``);
and the advice for each kind of failure."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import REPO, run_note


@pytest.fixture(scope="module")
def dag(airflow_db, demo_data):
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(REPO / "dags")).dags["taxiway_train"]


def test_one_line_keeps_a_reports_failing_checks():
    from taxiway_airflow.failure_summary import one_line

    gate = "preflight FAILED\n  [ok] documents: 160 docs\n  [FAIL] manifest: val/a.txt: size 10 != 12\n"
    assert one_line(gate) == "preflight FAILED: manifest: val/a.txt: size 10 != 12"
    assert one_line("x" * 500, limit=50) == "x" * 49 + "…"
    assert one_line("\n\nfirst\nsecond") == "first"
    assert one_line("invalid conf:\n  trian: not a conf key\n  x: no") == "invalid conf: trian: not a conf key; x: no"


@pytest.mark.parametrize(("task_id", "kind", "reason", "expected"), [
    ("resolve_config", "bad input", "train.lr: must be > 0", "fix the conf or config field"),
    ("preflight.gate", "check failed", "manifest line bad: /d/manifest.jsonl:53: field 'bytes' missing",
     "fix the manifest /d/manifest.jsonl line 53 and trigger a new run"),
    ("preflight.gate", "check failed", "preflight FAILED: overlap: 12% of val near-duplicates train",
     "preflight/report.md"),
    ("train.gang", "transient failure (try again)", "training gang failed: node 1 exited 1",
     "resume: clear the train group"),
    ("register.model_version", "transient failure (try again)", "MLflow unreachable",
     "when it is back, clear register.model_version"),
    ("evaluate.score", "unexpected error", "KeyError: 'x'", "read the log of evaluate.score"),
])
def test_advice_names_the_next_step(task_id: str, kind: str, reason: str, expected: str):
    from taxiway_airflow.failure_summary import advice

    assert expected in advice(task_id.split(".")[0], task_id, kind, reason, "/runs/r", 3)


def test_kinds_are_read_under_airflows_wrapper():
    from airflow.sdk.exceptions import AirflowFailException

    from pipelines.errors import BadInput, Transient
    from taxiway_airflow.failure_summary import _root_cause, kind_label

    try:
        try:
            raise BadInput("data.train: missing")
        except BadInput as exc:
            raise AirflowFailException(f"bad input: {exc}") from exc
    except AirflowFailException as wrapped:
        assert kind_label(_root_cause(wrapped)) == "bad input"
    assert kind_label(Transient("x")) == "transient failure (try again)" and kind_label(KeyError("x")) == "unexpected error"


def test_a_conf_typo_is_summarized_although_the_run_folder_was_never_made(dag):
    """resolve_config fails before it writes the run folder: the summary still lands there, so the
    DAG's callback keeps it (and its note) instead of writing a poorer one without the exception."""
    from pipelines.run_folder import RunFolder, run_dir

    dr = dag.test(run_conf={"trian": {"lr": 0.1}})
    assert str(dr.state) == "failed"
    summary = json.loads(RunFolder(run_dir(dr.dag_id, dr.run_id)).failure_summary.read_text())
    assert (summary["stage"], summary["kind"]) == ("resolve_config", "bad input"), summary
    assert summary["reason"].startswith("invalid conf: trian: not a conf key (did you mean 'train'?)"), summary["reason"]
    assert summary["next"] == "fix the conf or config field named above and trigger a new run"
    note = run_note("taxiway_train", dr.run_id)
    assert note.startswith("**Failed at resolve_config** (`resolve_config`, bad input): invalid conf: trian: not a conf"), note


@pytest.fixture
def slow_api_server(monkeypatch):
    """An api-server that takes 40 s to answer anything: the REST note's settings point at it."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    release = threading.Event()

    class Slow(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            release.wait(40)
            self.send_response(200)
            self.end_headers()

        do_POST = do_PATCH = _answer

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    for name, value in {"TAXIWAY_AIRFLOW_URL": f"http://127.0.0.1:{server.server_port}",
                        "TAXIWAY_AIRFLOW_USERNAME": "admin", "TAXIWAY_AIRFLOW_PASSWORD": "pw"}.items():
        monkeypatch.setenv(name, value)
    yield
    release.set()
    server.shutdown()
    server.server_close()


def test_a_note_over_a_slow_api_server_gives_up_within_the_callbacks_budget(slow_api_server):
    """A failed task's callback runs after the task reported its state, and Airflow's supervisor kills
    a task still running ``task_success_overtime`` (20 s) later: then a bad-input failure is retried
    (seen under make test's load). Setting the note over REST must give up within its budget, well
    inside that, whatever the api-server does."""
    import time

    from taxiway_airflow import run_note

    start = time.monotonic()
    why = run_note.set_note("taxiway_train", "manual__x", "**Failed**")
    took = time.monotonic() - start
    assert why is not None and "timed out" in why, why
    assert took < run_note.budget_s() + 2 < 20, took


def test_a_runs_summary_is_its_first_failure_until_a_clear_starts_its_next_try(home: Path, monkeypatch):
    """Two tasks fail in one try of a run (the gate and a shard, on one tampered file): the first one's
    summary stays, whichever callback comes last; once the run is cleared, its next failure replaces it."""
    from types import SimpleNamespace

    from pipelines.errors import BadInput, CheckFailed
    from pipelines.run_folder import RunFolder, run_dir
    from taxiway_airflow import failure_summary

    monkeypatch.delenv("TAXIWAY_AIRFLOW_URL", raising=False)
    run_id = "manual__first_failure"

    def fail(task_id: str, exc: Exception, clear_number: int) -> dict:
        ti = SimpleNamespace(task_id=task_id, dag_id="taxiway_train", map_index=-1, try_number=1)
        failure_summary.task_failed({"ti": ti, "run_id": run_id, "exception": exc,
                                     "dag_run": SimpleNamespace(clear_number=clear_number)})
        return json.loads(RunFolder(run_dir("taxiway_train", run_id)).failure_summary.read_text())

    assert fail("preflight.gate", CheckFailed("preflight FAILED"), 0)["task_id"] == "preflight.gate"
    kept = fail("tokenize.shard", BadInput("val/a.txt: content differs from the manifest"), 0)
    assert (kept["task_id"], kept["kind"]) == ("preflight.gate", "check failed"), kept
    after_clear = fail("tokenize.shard", BadInput("val/a.txt: content differs from the manifest"), 1)
    assert (after_clear["task_id"], after_clear["clear_number"]) == ("tokenize.shard", 1), after_clear


def test_a_note_quotes_a_crafted_conf_key_or_file_name_as_text_never_as_markup():
    """The note is Markdown (the grid renders it): a conf key or file name a trigger or the data chose
    must show as itself, adding no link, image, HTML or code span. Rendered here as GitHub-flavoured
    Markdown with raw HTML allowed and bare links made links, the most a renderer would make of it."""
    from html import unescape

    from markdown_it import MarkdownIt

    from taxiway_airflow.failure_summary import FailureSummary, one_line

    key = "[x](javascript:alert(1))"
    name = "a`b`<img src=x onerror=alert(1)>__x__&amp;*y*~~z~~|www.evil.example|me@evil.example.txt"
    reason = one_line(f"invalid conf:\n{key}: not a conf key\ntrain/{name}: see https://evil.example/x")
    for member in (None, "02"):
        summary = FailureSummary(dag_id="taxiway_train", run_id="r", task_id="resolve_config", stage="resolve_config",
                                 kind="bad input", reason=reason, next=f"fix train/{name}", run_folder="/runs/`a`<b>",
                                 at="2026-12-01T10:00:00+00:00", member=member)
        rendered = MarkdownIt("gfm-like").render(summary.note())
        assert "<strong>" in rendered  # the note's own markup still works
        assert not any(tag in rendered for tag in ("<a", "<img", "<em", "<s>", "<del", "<table")), rendered
        assert rendered.count("<code>") == 2, rendered  # the task and the folder, nothing the reason holds
        shown = unescape(re.sub(r"<[^>]+>", "", rendered))
        assert f"{key}: not a conf key; train/{name}: see https://evil.example/x" in shown, shown
        assert f"fix train/{name}" in shown and "/runs/`a`<b>" in shown, shown


def test_a_prompt_in_the_evaluation_report_is_text_never_markup():
    """``eval.prompts`` are a trigger's: the report (which the approval request a person answers quotes
    whole) once put a prompt in single backticks, so a prompt holding one made a live image and link."""
    from markdown_it import MarkdownIt

    from eval.report import markdown

    row = {"loss": 1.0, "bits_per_byte": 1.0, "perplexity": 2.7, "tokens": 10, "bytes": 40}
    gate = {"improvement_bpb": 0.1, "confidence": 0.95, "lower_bpb": 0.05, "upper_bpb": 0.2, "min_improvement": 0.0,
            "units": 8, "unit": "sequence", "samples": 100, "seed": 0}
    prompt = "x` ![pwn](https://evil.example/i.png) [click](https://evil.example) `"
    rep = {"passed": True, "summary": "s", "reason": "r", "candidate": row, "baseline": {**row, "label": "floor"},
           "gate": gate, "generations": [{"prompt": prompt, "seed": 0, "temperature": 0.8, "top_k": 40,
                                          "text": "````\n![pwn](https://evil.example/j.png)\n```"}]}
    rendered = MarkdownIt("gfm-like").render(markdown(rep))
    generations = rendered[rendered.index("Generations"):]
    assert "<img" not in generations and "<a " not in generations, generations
    assert "evil.example/i.png" in generations and "evil.example/j.png" in generations  # shown, as text
