"""Registration on real MLflow stores — SQLite, and PostgreSQL (a fresh database per session on the
session's own server, deploy/local/postgres.py) where it behaves differently — lineage, aliases, idempotence
after a crash, two runs finishing together, a deleted champion, an unreachable or briefly absent
store, and ``taxiway generate`` loading a registered model. (The locks: test_champion_locks.py.)"""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from postgres import create_db, drop_db, pg_uri
from trained_models import clone_run, make_run

from conftest import REPO, TINY, cli, in_task
from pipelines.errors import CheckFailed


@pytest.fixture
def backend(request, home: Path, monkeypatch) -> str:
    """The test's MLflow store: SQLite, or PostgreSQL (``ON_POSTGRESQL``) where it behaves differently:
    concurrent writers, and the advisory lock that serializes champion moves there."""
    kind = getattr(request, "param", "sqlite")
    uri = f"sqlite:///{home / 'registry-tests.db'}" if kind == "sqlite" else pg_uri(request.getfixturevalue("postgres_db"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return kind


ON_POSTGRESQL = pytest.mark.parametrize("backend", ["postgresql"], indirect=True)


@pytest.fixture(scope="module")
def models(session_home: Path, demo_data) -> dict[str, Path]:
    """Three models of rising quality on the same data (the strong one with its preflight report)."""
    return {"weak": make_run(session_home, "reg-weak", 5, ["name=reg-weak"]),
            "medium": make_run(session_home, "reg-medium", 60, ["name=reg-medium"]),
            "strong": make_run(session_home, "reg-strong", 300, ["name=reg-strong"], preflight=True)}


def _run(home: Path, src: Path, model_name: str, label: str, *extra: str) -> Path:
    return clone_run(home, src, f"{model_name}-{label}", [f"registry.model_name={model_name}", f"name={model_name}",
                                                          "registry.retry_backoff_s=0.2", *extra])


def _evaluate(run_dir: Path, baseline: str | None = None) -> dict:
    from pipelines import stages

    return stages.evaluate.run(stages.prepare.load_run_config(run_dir), run_dir, baseline)


def _register(run_dir: Path, key: str, airflow: dict | None = None) -> dict:
    from pipelines import stages

    return stages.register.run(stages.prepare.load_run_config(run_dir), run_dir, key, airflow)


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def _artifacts(c, run_id: str, path: str | None = None) -> set[str]:
    out: set[str] = set()
    for a in c.list_artifacts(run_id, path):
        out |= _artifacts(c, run_id, a.path) if a.is_dir else {a.path}
    return out


def test_experiments_open_on_the_model_training_view_and_runs_are_named_for_people(home: Path):
    """MLflow 3's UI picks an experiment's page by its kind tag: Taxiway's are "custom_model_development"
    (the runs table, not the GenAI traces page), set on new experiments and on untagged older ones; a
    kind someone chose stays. Runs are named config name, UTC time, short id; the run key is a tag."""
    from pipelines.config import load_config
    from pipelines.registry import RUN_KEY_TAG, client, open_run

    c = client()
    older, chosen, new = _unique("older"), _unique("chosen"), _unique("new")
    c.create_experiment(older)
    c.create_experiment(chosen, tags={"mlflow.experimentKind": "genai_development"})
    ids = {}
    for name in (older, chosen, new):
        ids[name] = open_run(c, load_config(TINY, [f"name={name}"]), f"manual__2026-12-01T10:00:00+00:00-{name}")
    kinds = {name: c.get_experiment_by_name(name).tags.get("mlflow.experimentKind") for name in ids}
    assert kinds == {older: "custom_model_development", chosen: "genai_development", new: "custom_model_development"}
    run = c.get_run(ids[new])
    assert re.fullmatch(rf"{new} \d{{4}}-\d\d-\d\d \d\d:\d\d UTC [0-9a-f]{{6}}", run.info.run_name), run.info.run_name
    assert run.data.tags[RUN_KEY_TAG] == f"manual__2026-12-01T10:00:00+00:00-{new}"
    again = open_run(c, load_config(TINY, [f"name={new}"]), f"manual__2026-12-01T10:00:00+00:00-{new}")
    assert again == ids[new]  # found again by its key, whatever its name


def test_registration_records_lineage_then_a_worse_model_is_challenger(backend, models, home: Path):
    from pipelines.registry import RUN_KEY_TAG, client
    from trainer.fsio import sha256_file

    name = _unique(f"lineage-{backend}")
    first = _run(home, models["strong"], name, "first")
    report = _evaluate(first)
    assert report["passed"] and report["baseline"]["kind"] == "floor"
    reg = _register(first, "manual__first", {"dag_id": "taxiway_train", "run_id": "manual__first"})
    assert reg["alias"] == "champion" and reg["version"] == "1"

    c = client()
    mv = c.get_model_version_by_alias(name, "champion")
    tags = mv.tags
    assert tags["taxiway.config_sha256"] == (first / "config.sha256").read_text().strip()
    assert tags["taxiway.weights_sha256"] == sha256_file(first / "model" / "model.safetensors")
    packed = json.loads((first / "tokenize" / "packed.json").read_text())
    assert tags["taxiway.packed_dataset"] == packed["key"]
    assert tags["taxiway.tokenizer_sha256"] == json.loads(
        (Path(packed["path"]) / "manifest.json").read_text())["tokenizer_sha256"]
    assert tags["taxiway.data_manifest_sha256"] == sha256_file(home / "demo-data" / "manifest.jsonl")
    assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", tags["taxiway.code_version"]) and tags["taxiway.parent_model"] == "none"
    assert tags["airflow.dag_id"] == "taxiway_train" and tags["airflow.run_id"] == tags[RUN_KEY_TAG] == "manual__first"
    assert tags["taxiway.eval.passed"] == "true" and tags["taxiway.baseline"] == "uniform floor"
    assert float(tags["taxiway.eval.lower_bound_bpb"]) > 0
    assert float(tags["taxiway.eval.delta_bits_per_byte"]) == pytest.approx(-report["improvement_bpb"], abs=1e-6)
    assert tags["taxiway.replaced_champion"] == "none (floor)"
    assert mv.description.startswith("Gate passed vs uniform floor: ") and len(mv.description) < 200
    assert "\n" not in mv.description and "eval/report.md" in mv.description  # short; details in tags, artifacts

    run = c.get_run(mv.run_id)
    assert re.fullmatch(rf"{name} \d{{4}}-\d\d-\d\d \d\d:\d\d UTC [0-9a-f]{{6}}", run.info.run_name), run.info.run_name
    assert run.data.tags[RUN_KEY_TAG] == run.data.tags["airflow.run_id"] == "manual__first"
    assert c.get_experiment(run.info.experiment_id).tags["mlflow.experimentKind"] == "custom_model_development"
    report_md = (first / "eval" / "report.md").read_text()
    assert "![" in report_md and "](comparison.png)" in report_md  # the image beside the report, in MLflow too
    inputs = {d.dataset.name: {t.key: t.value for t in d.tags} for d in run.inputs.dataset_inputs}
    assert {k: v["mlflow.data.context"] for k, v in inputs.items()} == {
        f"{name}-train": "training", f"{name}-val": "evaluation", f"{name}-packed": "training"}
    assert int(inputs[f"{name}-val"]["files"]) == 16
    assert {"config/config.yaml", "preflight/report.json", "preflight/overlap.png", "packed/manifest.json",
            "tokenizer/tokenizer.json", "eval/report.json", "eval/report.md", "eval/comparison.png",
            "eval/per_unit.csv", "model/MLmodel", *(f"model/artifacts/model/{f}" for f in (  # an MLflow Model of
                "model.safetensors", "model.json", "tokenizer.json", "config.json", "tokenizer_config.json"))  # the folder
            } <= _artifacts(c, mv.run_id)
    assert run.data.params["train.lr"] == "0.005" and run.data.params["eval.confidence"] == "0.95"
    assert [m.step for m in c.get_metric_history(mv.run_id, "loss")] == list(range(10, 301, 10))
    assert run.data.metrics["eval.lower_bpb"] == pytest.approx(report["gate"]["lower_bpb"])

    worse = _run(home, models["weak"], name, "worse")
    failed = _evaluate(worse)
    assert not failed["passed"] and failed["baseline"]["label"] == f"champion models:/{name}/1"
    second = _register(worse, "manual__worse")
    assert second["alias"] == "challenger"
    assert str(c.get_model_version_by_alias(name, "champion").version) == str(mv.version)
    challenger = c.get_model_version_by_alias(name, "challenger")
    assert str(challenger.version) == second["version"] == "2"
    assert challenger.tags["taxiway.eval.passed"] == "false"
    assert challenger.tags["taxiway.alias_reason"] == failed["reason"]
    assert challenger.tags["taxiway.baseline_version"] == f"models:/{name}/1"


def test_a_version_is_saved_without_loading_its_model_and_keeps_its_serving_params(models, tmp_path: Path,
                                                                                    monkeypatch):
    """Saving a Llama's MLflow Model never loads the model (MLflow predicts the input example when it infers
    a signature from ``predict``'s type hints: a whole model in memory to register it), and the signature a
    server checks requests against keeps ``max_new_tokens`` and ``temperature``."""
    import transformers
    import yaml

    from pipelines.registry import served

    loaded = []
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: loaded.append(a))

    class Logged:
        def log_artifacts(self, run_id: str, path: str, artifact_path: str) -> None:
            shutil.copytree(path, tmp_path / artifact_path)

    served.log_model(Logged(), "run", models["weak"] / "model")
    assert loaded == [], "the model was loaded to save it"
    mlmodel = yaml.safe_load((tmp_path / served.ARTIFACT / "MLmodel").read_text())
    params = {p["name"]: p.get("default") for p in json.loads(mlmodel["signature"]["params"])}
    assert params == {"max_new_tokens": 64, "temperature": 0.0}, params
    assert (tmp_path / served.ARTIFACT / mlmodel["saved_input_example_info"]["artifact_path"]).is_file()


def test_crashed_attempts_are_retried_into_one_version(backend, models, home: Path, monkeypatch):
    from mlflow import MlflowClient

    from pipelines.registry import RUN_KEY_TAG, client

    name = _unique(f"crash-{backend}")
    run_dir = _run(home, models["medium"], name, "run")
    _evaluate(run_dir)

    def crash(*args, **kwargs):
        raise RuntimeError("worker died")

    with monkeypatch.context() as m:  # dies while logging artifacts: the MLflow run is left unfinished
        m.setattr(MlflowClient, "log_artifacts", crash)
        with pytest.raises(RuntimeError, match="worker died"):
            _register(run_dir, "scheduled__1")
    with monkeypatch.context() as m:  # dies after the version was created, before any alias moved
        m.setattr(MlflowClient, "set_registered_model_alias", crash)
        with pytest.raises(RuntimeError, match="worker died"):
            _register(run_dir, "scheduled__1")
    c = client()
    assert len(c.search_model_versions(f"name = '{name}'")) == 1
    result = _register(run_dir, "scheduled__1")
    again = _register(run_dir, "scheduled__1")
    assert result == again and result["alias"] == "champion"
    versions = c.search_model_versions(f"name = '{name}' and tags.`{RUN_KEY_TAG}` = 'scheduled__1'")
    assert [str(v.version) for v in versions] == [result["version"]]
    exp = c.get_experiment_by_name(name)
    runs = c.search_runs([exp.experiment_id], f"tags.`{RUN_KEY_TAG}` = 'scheduled__1'")
    assert [r.info.run_id for r in runs] == [result["run_id"]] and runs[0].info.status == "FINISHED"
    assert "model/artifacts/model/model.safetensors" in _artifacts(c, result["run_id"])

    # the same run evaluated again now ties with itself (the champion): it stays champion
    assert not _evaluate(run_dir)["passed"]
    tie = _register(run_dir, "scheduled__1")
    assert tie["alias"] == "champion" and tie["reason"].startswith("already the champion")
    assert str(c.get_model_version_by_alias(name, "champion").version) == result["version"]
    with pytest.raises(Exception, match="alias challenger not found"):
        c.get_model_version_by_alias(name, "challenger")


def _champion_chain(c, name: str) -> list[str]:
    """Versions that held champion, oldest first, following each one's ``replaced_champion`` tag."""
    chain, mv = [], c.get_model_version_by_alias(name, "champion")
    while True:
        chain.insert(0, str(mv.version))
        replaced = mv.tags["taxiway.replaced_champion"]
        if not replaced.startswith("models:/"):
            return chain
        mv = c.get_model_version(name, replaced.rsplit("/", 1)[1])


def _three_candidates(home: Path, models: dict[str, Path], name: str) -> tuple[Path, Path]:
    """A weak champion, then a medium and a strong candidate both evaluated against it."""
    base = _run(home, models["weak"], name, "c0")
    assert _evaluate(base)["passed"]
    assert _register(base, f"{name}-c0")["alias"] == "champion"
    medium, strong = _run(home, models["medium"], name, "b"), _run(home, models["strong"], name, "a")
    for run_dir in (medium, strong):
        rep = _evaluate(run_dir)
        assert rep["passed"] and rep["baseline"]["version"] == "1"
    return medium, strong


def test_champion_that_moved_meanwhile_is_beaten_again_or_kept(backend, models, home: Path):
    """Forced interleavings: the worse candidate registers first, then the better — and the other way."""
    from pipelines.registry import client

    c = client()
    name = _unique(f"stale-{backend}")
    medium, strong = _three_candidates(home, models, name)
    assert _register(medium, f"{name}-b")["alias"] == "champion"        # beat v1, v1 still champion
    won = _register(strong, f"{name}-a")                                 # evaluated vs v1; champion is now v2
    assert won["alias"] == "champion"
    report = json.loads((strong / "eval" / "report.json").read_text())
    assert report["baseline"]["version"] == "2", "re-evaluated against the champion that moved"
    assert _champion_chain(c, name) == ["1", "2", won["version"]]
    assert c.get_model_version(name, won["version"]).tags["taxiway.baseline_version"] == f"models:/{name}/2"

    name = _unique(f"stale-{backend}")
    medium, strong = _three_candidates(home, models, name)
    first = _register(strong, f"{name}-a")
    lost = _register(medium, f"{name}-b")                                # evaluated vs v1; champion is now the strong one
    assert lost["alias"] == "challenger" and "does not beat champion" in lost["reason"]
    assert json.loads((medium / "eval" / "report.json").read_text())["baseline"]["version"] == first["version"]
    assert str(c.get_model_version_by_alias(name, "champion").version) == first["version"]
    assert _champion_chain(c, name) == ["1", first["version"]]


def test_champion_that_keeps_moving_leaves_the_model_challenger(models, home: Path, monkeypatch):
    """No re-evaluation left (``registry.max_reevaluations=0``): a model evaluated against a champion
    that has moved since is not promoted — challenger, saying why, its report left as it was."""
    from pipelines.registry import client

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{home / 'registry-tests.db'}")
    name = _unique("moving")
    base = _run(home, models["weak"], name, "c0")
    assert _evaluate(base)["passed"]
    assert _register(base, f"{name}-c0")["alias"] == "champion"
    medium = _run(home, models["medium"], name, "b")
    strong = _run(home, models["strong"], name, "a", "registry.max_reevaluations=0")
    for run_dir in (medium, strong):
        assert _evaluate(run_dir)["baseline"]["version"] == "1"
    assert _register(medium, f"{name}-b")["alias"] == "champion"
    evaluated = (strong / "eval" / "report.json").read_text()
    kept = _register(strong, f"{name}-a")
    assert kept["alias"] == "challenger" and kept["reason"] == (
        "not promoted: the champion moved to version 2 while this model was evaluated against 1; evaluate it again")
    assert (strong / "eval" / "report.json").read_text() == evaluated
    c = client()
    assert str(c.get_model_version_by_alias(name, "champion").version) == "2"
    challenger = c.get_model_version_by_alias(name, "challenger")
    assert str(challenger.version) == kept["version"] and challenger.tags["taxiway.alias_reason"] == kept["reason"]
    assert json.loads((strong / "registry.json").read_text()) == kept


@ON_POSTGRESQL
def test_two_processes_finishing_together_leave_the_better_champion(backend, models, home: Path):
    from pipelines.registry import client

    name = _unique(f"race-{backend}")
    medium, strong = _three_candidates(home, models, name)
    procs = [subprocess.Popen([str(Path(sys.executable).parent / "taxiway"), "register", "-c", str(d / "config.yaml"),
                               "--run-dir", str(d), "--run-key", f"{name}-{d.name}"], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for d in (medium, strong)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    results = {d.name: json.loads(Path(out.strip().splitlines()[-1]).read_text())
               for d, (out, _) in zip((medium, strong), outs, strict=True)}
    c = client()
    champion = str(c.get_model_version_by_alias(name, "champion").version)
    assert champion == results[strong.name]["version"]
    assert len(c.search_model_versions(f"name = '{name}'")) == 3
    chain = _champion_chain(c, name)
    assert chain in (["1", champion], ["1", results[medium.name]["version"], champion])
    # both were evaluated against version 1; whichever came second found the champion moved and
    # was evaluated again against the first (a broken lock would let both promote against version 1)
    medium_base, strong_base = (json.loads((d / "eval" / "report.json").read_text())["baseline"]["version"]
                                for d in (medium, strong))
    if strong_base == "1":  # the strong one promoted first; the medium one then lost to it
        assert medium_base == results[strong.name]["version"] and results[medium.name]["alias"] == "challenger"
    else:                   # the medium one promoted first; the strong one then beat it
        assert (medium_base, strong_base) == ("1", results[medium.name]["version"])
    # every move of the alias was a gate decision against the very model it replaced
    for old, new in zip(chain, chain[1:], strict=False):
        assert c.get_model_version(name, new).tags["taxiway.baseline_version"] == f"models:/{name}/{old}"


def test_deleted_champion_is_a_clear_error(backend, models, home: Path):
    from pipelines.registry import ChampionMissing, client

    name = _unique(f"deleted-{backend}")
    first = _run(home, models["medium"], name, "first")
    _evaluate(first)
    assert _register(first, f"{name}-1")["alias"] == "champion"
    client().delete_model_version(name, "1")
    nxt = _run(home, models["strong"], name, "next")
    with pytest.raises(ChampionMissing, match=rf"models:/{name}@champion: the champion, version 1, was deleted"):
        _evaluate(nxt)
    assert not (nxt / "eval" / "report.json").exists()
    proc = cli("evaluate", "-c", str(nxt / "config.yaml"), "--run-dir", str(nxt))
    assert proc.returncode == 2 and "eval.baseline=floor" in proc.stderr

    restart = _run(home, models["strong"], name, "restart", "eval.baseline=floor")
    assert _evaluate(restart)["passed"]
    assert _register(restart, f"{name}-restart")["alias"] == "champion"


def test_unreachable_mlflow_fails_clearly_after_retries(models, home: Path, monkeypatch, caplog):
    from pipelines.registry import RegistryUnavailable
    from pipelines.registry.client import redacted

    uri = "http://127.0.0.1:1"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    run_dir = _run(home, models["medium"], _unique("unreachable"), "run", "registry.retries=2",
                   "registry.retry_backoff_s=0.1")
    shown = redacted(uri)  # a user name alone may be a token: never shown
    with caplog.at_level("WARNING", logger="taxiway.registry"):
        with pytest.raises(RegistryUnavailable,
                           match=re.escape(f"MLflow at {shown} unavailable: read the champion failed 3 times")):
            _evaluate(run_dir)
    assert sum("retry" in r.getMessage() for r in caplog.records) == 2, caplog.text  # each retry is logged
    proc = cli("evaluate", "-c", str(run_dir / "config.yaml"), "--run-dir", str(run_dir))
    assert proc.returncode == 3 and f"error: transient failure (try again): MLflow at {shown} unavailable" in proc.stderr


def test_store_that_comes_back_is_retried(models, home: Path, monkeypatch, postgres_db, caplog):
    """The database is created when the first attempt has failed: the retries carry the registration through."""
    late = f"taxiway_test_late_{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{home / 'registry-tests.db'}")
    run_dir = _run(home, models["medium"], _unique("late"), "run", "registry.retries=8",
                   "registry.retry_backoff_s=0.25", "eval.baseline=floor")
    _evaluate(run_dir)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", pg_uri(late))

    class ComesBack(logging.Handler):
        """Creates the database on the first logged retry: the event the test means, not a clock."""
        def emit(self, record: logging.LogRecord) -> None:
            if "retry 1/8" in record.getMessage():
                create_db(late)

    logger = logging.getLogger("taxiway.registry")
    logger.addHandler(handler := ComesBack(level=logging.WARNING))
    try:
        with caplog.at_level("WARNING", logger="taxiway.registry"):
            result = _register(run_dir, "late-run")
        assert result["alias"] == "champion"
        assert [r.getMessage() for r in caplog.records if "MLflow unavailable" in r.getMessage()] \
            and not any("retry 2/8" in r.getMessage() for r in caplog.records), caplog.text
    finally:
        logger.removeHandler(handler)
        drop_db(late)


def _generated(uri: str, prompts: list[str], seed: int) -> list[str]:
    """What ``taxiway generate`` prints for ``prompts`` (16 new tokens each)."""
    out = cli("generate", uri, *sum((["--prompt", p] for p in prompts), []), "--max-new-tokens", "16", "--seed", str(seed))
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()


def test_generate_loads_the_champion_from_mlflow(models, home: Path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{home / 'registry-tests.db'}")
    name = _unique("generate")
    run_dir = _run(home, models["strong"], name, "run")
    _evaluate(run_dir)
    version = _register(run_dir, f"{name}-1")["version"]
    lines = _generated(f"models:/{name}@champion", ["def ", "import "], seed=0)
    assert lines[0].startswith("def ") and lines[-1].startswith("import ") and len("".join(lines)) > len("def import ") + 8
    assert _generated(f"models:/{name}@champion", ["def ", "import "], seed=0) == lines  # a seed decides the text
    assert _generated(f"models:/{name}@champion", ["def ", "import "], seed=7) != lines

    # the stored weights corrupted after registration: refused by the sha256 recorded then
    from pipelines.registry import client, served

    source = served.model_folder(Path(client().get_model_version(name, version).source.removeprefix("file://")))
    (source / "model.safetensors").write_bytes((source / "model.safetensors").read_bytes()[:-8] + b"\0" * 8)
    for cached in (home / "cache" / "models").glob(f"{name}-v*"):
        shutil.rmtree(cached)
    bad = cli("generate", f"models:/{name}@champion", "--prompt", "def ")
    assert bad.returncode == 2 and "does not match the sha256 recorded at registration" in bad.stderr
    missing = cli("generate", f"models:/{name}@nope", "--prompt", "x")
    assert missing.returncode == 2 and f"models:/{name}@nope: no such model version" in missing.stderr


def test_baseline_with_another_tokenizer_is_compared_document_by_document(models, home: Path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{home / 'registry-tests.db'}")
    name = _unique("vocab")
    small = make_run(home, "reg-vocab300", 200, ["name=reg-vocab300", "tokenizer.vocab_size=300"])
    champion = clone_run(home, small, f"{name}-c", [f"registry.model_name={name}", f"name={name}",
                                                     "tokenizer.vocab_size=300"])
    _evaluate(champion)
    assert _register(champion, f"{name}-c")["alias"] == "champion"
    candidate = _run(home, models["strong"], name, "cand", "eval.max_batches=300")
    report = _evaluate(candidate)
    assert report["baseline"]["kind"] == "champion" and report["gate"]["unit"] == "document"
    assert report["gate"]["units"] > 1
    assert report["candidate"]["bits_per_byte"] != report["baseline"]["bits_per_byte"]


def test_parent_is_the_baseline_and_recorded_as_the_version_training_started_from(models, home: Path, monkeypatch):
    from pipelines import stages
    from pipelines.registry import client

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{home / 'registry-tests.db'}")
    name = _unique("parent")
    first = _run(home, models["strong"], name, "first")
    _evaluate(first)
    assert _register(first, f"{name}-1")["version"] == "1"
    child = _run(home, models["medium"], name, "child", f"parent=models:/{name}@champion", "eval.baseline=parent")
    stages.parent.weights(stages.prepare.load_run_config(child), child)  # what the train stage fetches
    report = _evaluate(child)
    assert report["baseline"]["kind"] == "parent" and report["baseline"]["version"] == "1"
    assert not report["passed"]  # 60 steps do not beat the 300-step parent
    result = _register(child, f"{name}-child")
    assert result["alias"] == "challenger"
    tags = client().get_model_version(name, result["version"]).tags
    assert tags["taxiway.parent_model"] == f"models:/{name}/1"
    assert tags["taxiway.baseline"] == f"parent models:/{name}/1"


@pytest.mark.parametrize(("uri", "logged", "browsed"), [
    ("https://s3cr3ttoken@mlflow.example.org/", "https://***@mlflow.example.org/", "https://mlflow.example.org/"),
    ("https://s3cr3ttoken:x-oauth-basic@mlflow.example.org", "https://***@mlflow.example.org",
     "https://mlflow.example.org"),
    ("https://user:s3c@r3t@mlflow.example.org:443/a", "https://***@mlflow.example.org:443/a",
     "https://mlflow.example.org:443/a"),
    ("postgresql+psycopg2://mlflow:s3c/r3t?#x@db:5432/mlflow?sslmode=require&password=s3cr3t",
     "postgresql+psycopg2://***@db:5432/mlflow?sslmode=require&password=***", None),
    ("https://mlflow.example.org/api?token=s3cr3t&x=1&Access_Token=s3cr3t#/runs",
     "https://mlflow.example.org/api?token=***&x=1&Access_Token=***#/runs", "https://mlflow.example.org/api?x=1#/runs"),
    ("https://host/?X-Amz-Signature=s3cr3t#access_token=s3cr3t", "https://host/?X-Amz-Signature=***#access_token=***",
     "https://host/"),
    ("https://host/a?mail=me@example.org&token=s3cr3t", "https://***@example.org&token=***", "https://example.org"),
    ("sqlite:////tmp/a@b/mlflow.db", "sqlite:////tmp/a@b/mlflow.db", None),
    ("http://127.0.0.1:5000", "http://127.0.0.1:5000", "http://127.0.0.1:5000"),
    ("models:/taxiway@champion", "models:/taxiway@champion", None),
])
def test_no_credential_in_a_uri_leaves_redacted_or_reaches_a_browser(uri: str, logged: str, browsed: str | None):
    """Userinfo is a secret whole (a token alone, or a token as the user name), and so are query
    parameters that name one; the browser's copy has none of them at all."""
    from pipelines.registry.client import redacted, without_credentials

    assert redacted(uri) == logged and not re.search("s3c|r3t", redacted(uri))  # no piece of a secret
    if browsed is not None:
        assert without_credentials(uri) == browsed


def _decide(run_dir: Path, choice: str, by: str | None, comment: str = "", triggered_by: str | None = "tom") -> dict:
    from pipelines import stages
    from pipelines.registry.approval import Decision

    return stages.register.decide(stages.prepare.load_run_config(run_dir), run_dir,
                                  Decision(choice, by, "2026-12-05T03:00:00+00:00", comment, by_id=by),
                                  triggered_by=triggered_by)


def test_with_approval_required_only_a_persons_approval_moves_the_champion(models, home: Path, monkeypatch):
    """``registry.approval: required``: a passed gate registers the version pending, holding no alias;
    approve → champion (and only while the champion is still the one it was evaluated against: else
    challenger); reject and timeout → challenger. Who, when and the comment are tags on the version."""
    from pipelines.registry import client

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{home / 'registry-tests.db'}")
    c, name = client(), _unique("approval")
    required = "registry.approval=required"
    weak = _run(home, models["weak"], name, "w", required, "registry.approvers=[ada, bob, eve]")
    assert _evaluate(weak)["passed"]
    pending = _register(weak, f"{name}-w")
    assert pending["approval"] == "pending" and pending["alias"] is None
    assert c.get_model_version(name, pending["version"]).tags["taxiway.approval"] == "pending"
    assert not c.get_registered_model(name).aliases, "nothing moves before a person answers"
    # separation of duties: neither the run's own triggering user nor anyone the deployment did not name
    for by, triggered_by, why in (("ada", "ada", "triggered this run"), ("mallory", "tom", "not one of registry.approvers")):
        with pytest.raises(CheckFailed, match=why):
            _decide(weak, "approved", by, triggered_by=triggered_by)
        record = json.loads((weak / "registry.json").read_text())
        assert record["approval"] == "pending" and record["approval_refused"]["by"] == by
        assert c.get_model_version(name, pending["version"]).tags["taxiway.approval"] == "pending"
        assert not c.get_registered_model(name).aliases

    approved = _decide(weak, "approved", "ada", "looks right")
    assert approved["alias"] == "champion" and approved["approval"] == "approved"
    tags = c.get_model_version(name, approved["version"]).tags
    assert (tags["taxiway.approval"], tags["taxiway.approval.by"], tags["taxiway.approval.comment"]) == (
        "approved", "ada", "looks right")
    assert tags["taxiway.approval.at"] == "2026-12-05T03:00:00+00:00"
    again = _register(weak, f"{name}-w")  # a cleared register task: the decision stands, no one is asked again
    assert (again["version"], again["alias"], again["approval"]) == (approved["version"], "champion", "approved")

    medium, strong = _run(home, models["medium"], name, "m", required), _run(home, models["strong"], name, "s", required)
    for run_dir in (medium, strong):
        assert _evaluate(run_dir)["baseline"]["version"] == approved["version"]
        assert _register(run_dir, f"{name}-{run_dir.name}")["approval"] == "pending"
    assert _decide(strong, "approved", "ada")["alias"] == "champion"
    stale = _decide(medium, "approved", "bob")
    assert stale["alias"] == "challenger" and "moved to version" in stale["reason"] and "while this model waited" in stale["reason"]

    name = _unique("approval")
    for label, choice, why in (("t", "timed_out", "registry.approval_timeout_s"), ("r", "rejected", "rejected by eve")):
        run_dir = _run(home, models["medium"], name, label, required)
        assert _evaluate(run_dir)["passed"] and _register(run_dir, f"{name}-{label}")["approval"] == "pending"
        decided = _decide(run_dir, choice, None if choice == "timed_out" else "eve")
        assert decided["alias"] == "challenger" and why in decided["reason"], decided
        assert c.get_model_version(name, decided["version"]).tags["taxiway.approval"] == choice
    assert "champion" not in c.get_registered_model(name).aliases
    assert c.get_model_version(name, "1").tags["taxiway.approval.by"] == "(timeout)"
    with pytest.raises(Exception, match="not waiting for approval"):
        _decide(run_dir, "approved", "eve")


def test_a_forged_approval_decides_nothing(tmp_path: Path):
    """What a user who may edit XComs and task states but approves nothing can forge (test_live_approval's
    ``tom``): ``register.approval`` marked success by hand, with a ``return_value`` saying "approved", and
    ``resolve_config``'s XCom pointed at another run's folder, one with an answer. The decision reads only
    the answer ``register.approval`` recorded in the DAG run's own folder, finds none, and fails."""
    from airflow.exceptions import AirflowFailException

    from pipelines.run_folder import RunFolder
    from taxiway_airflow.tasks.train import decide

    elsewhere = tmp_path / "another-run"
    elsewhere.mkdir()
    forged = {"choice": "approved", "by": "ada", "by_id": "ada", "at": "2026-12-05T00:00:00+00:00", "comment": ""}
    RunFolder(elsewhere).approval_answer.write_text(json.dumps(forged))
    with in_task("taxiway_train", "manual__forged", triggered_by="tom") as own, \
            pytest.raises(AirflowFailException, match="recorded no answer") as refused:
        decide.function({"run_dir": str(elsewhere), "config_sha256": "0" * 64, "name": "x"}, forged)
    assert str(own) in str(refused.value) and str(elsewhere) not in str(refused.value)
