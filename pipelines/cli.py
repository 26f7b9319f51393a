"""``taxiway``: every stage from the command line, no Airflow needed.

Exit codes (``pipelines/errors.py``): 0 success, 1 a gate or check failed, 2 bad input or usage,
3 a transient failure (a service or the machine; try again). The last line printed
names the main file written. Without ``--run-dir`` a run folder is derived from the config
(``$TAXIWAY_HOME/runs/<name>-<config sha256[:12]>``), so stages run one after another chain.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import time
from pathlib import Path, PurePosixPath
from typing import Annotated

import typer

from pipelines import manifest, run_folder, stages
from pipelines.config import RunConfig, load_config
from pipelines.demo_data import write_demo_data
from pipelines.errors import BadInput, CheckFailed, kind_of
from pipelines.heap import set_policy
from pipelines.launch import k8s
from pipelines.launch.spec import launch_spec
from pipelines.refresh import announce
from pipelines.refresh import landing as zone
from pipelines.refresh.plan import RefreshPlan
from pipelines.run_folder import RunFolder
from pipelines.stages.prepare import prepare

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Taxiway: raw text to an evaluated, registered language model.")

ConfigOpt = Annotated[Path, typer.Option("--config", "-c", help="YAML run config (may use extends:)")]
SetOpt = Annotated[list[str] | None, typer.Option("--set", "-s", help="Override: key.path=value (repeatable)")]
RunDirOpt = Annotated[Path | None, typer.Option("--run-dir", help="Run folder (default: derived from the config)")]

EXIT_GATE, EXIT_INPUT = CheckFailed.exit_code, BadInput.exit_code


def _fail(message: str, code: int) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def _setup(config: Path, overrides: list[str] | None, run_dir: Path | None) -> tuple[RunConfig, Path]:
    cfg = load_config(config, overrides or [])
    folder = (run_dir or run_folder.named_run_dir(f"{cfg.name}-{cfg.sha256()[:12]}")).resolve()
    prepare(cfg, folder)
    return cfg, folder


def _guard(fn):
    """One clear line and the kind's exit code (2 bad input, 1 check failed, 3 try again),
    whatever the stage; an unexpected error keeps its traceback."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except typer.Exit:
            raise
        except Exception as exc:
            if (kind := kind_of(exc)) is None:
                raise
            raise _fail(f"{exc}" if kind is BadInput else f"{kind.label}: {exc}", kind.exit_code) from None

    return wrapper


@app.command("demo-data")
@_guard
def demo_data(out_dir: Path, seed: int = 0, max_files: Annotated[int | None, typer.Option()] = None,
              force: bool = False) -> None:
    """Write a demo corpus (train/, val/, manifest.jsonl) from the standard library's sources."""
    typer.echo(write_demo_data(out_dir, seed=seed, max_files=max_files, force=force))


@app.command("manifest")
@_guard
def manifest_cmd(data_dir: Path, output: Annotated[Path | None, typer.Option("-o", "--output")] = None) -> None:
    """Write a manifest for DATA_DIR/train and DATA_DIR/val (default DATA_DIR/manifest.jsonl)."""
    entries = manifest.scan(data_dir)
    typer.echo(manifest.write(output or Path(data_dir) / "manifest.jsonl", entries))


@app.command()
@_guard
def preflight(config: ConfigOpt, set: SetOpt = None, run_dir: RunDirOpt = None,
              workers: Annotated[int | None, typer.Option(
                  min=1, help="Processes scanning the shards (default: preflight.workers, else all cores)")] = None,
              ) -> None:
    """Check the data against its manifest and for train/val overlap; exit 1 when the gate fails."""
    cfg, folder = _setup(config, set, run_dir)
    report = stages.preflight.run(cfg, folder, workers)
    typer.echo(report.summary())
    typer.echo(RunFolder(folder).preflight_report)
    if not report.passed:
        raise typer.Exit(EXIT_GATE)


@app.command()
@_guard
def tokenize(config: ConfigOpt, set: SetOpt = None, run_dir: RunDirOpt = None,
             workers: Annotated[int | None, typer.Option(
                 min=1, help="Encode the shards (pack.shard_bytes each) on N one-thread processes, then pack, "
                             "as the DAG's mapped tasks do (default: one process on every core)")] = None) -> None:
    """Train the tokenizer and pack both splits (reused from the cache when inputs are unchanged)."""
    cfg, folder = _setup(config, set, run_dir)
    packed = stages.tokenize.run(cfg, folder, workers, RefreshPlan.of_run(folder))
    stats = packed.manifest()
    typer.echo(f"{'cache hit' if packed.cache_hit else 'packed'}: "
               + ", ".join(f"{s}: {v['windows']} windows, {v['tokens']} tokens" for s, v in stats["splits"].items()))
    typer.echo(packed.path / "manifest.json")


@app.command()
@_guard
def train(config: ConfigOpt, set: SetOpt = None, run_dir: RunDirOpt = None) -> None:
    """Train as a local gang of compute.nodes torchrun nodes; resumes from the newest valid checkpoint."""
    cfg, folder = _setup(config, set, run_dir)
    started = time.monotonic()
    model_dir = stages.train.run(cfg, folder, on_poll=_progress(folder))
    typer.echo(stages.train.progress_line(folder, time.monotonic() - started))
    typer.echo(model_dir / "model.safetensors")


def _progress(folder: Path):
    """Progress lines on stderr while the gang trains."""
    return stages.train.progress_ticker(folder, lambda line: typer.echo(line, err=True))


@app.command()
@_guard
def evaluate(config: ConfigOpt, set: SetOpt = None, run_dir: RunDirOpt = None) -> None:
    """Score the trained model against the baseline; exit 1 when the gate fails."""
    cfg, folder = _setup(config, set, run_dir)
    report = stages.evaluate.run(cfg, folder, refresh=RefreshPlan.of_run(folder))
    typer.echo(report["reason"])
    typer.echo(RunFolder(folder).eval_report)
    if not report["passed"]:
        raise typer.Exit(EXIT_GATE)


@app.command()
@_guard
def register(config: ConfigOpt, set: SetOpt = None, run_dir: RunDirOpt = None,
             run_key: Annotated[str | None, typer.Option(help="Idempotency key (default: run folder name)")] = None) -> None:
    """Log the run to MLflow and register the model; alias champion only if the gate passed."""
    cfg, folder = _setup(config, set, run_dir)
    result = stages.register.run(cfg, folder, run_key or folder.name, refresh=RefreshPlan.of_run(folder))
    typer.echo(json.dumps(result))
    typer.echo(RunFolder(folder).registry_record)


@app.command()
@_guard
def run(config: ConfigOpt, set: SetOpt = None, run_dir: RunDirOpt = None) -> None:
    """All five stages in order, without Airflow."""
    cfg, folder = _setup(config, set, run_dir)
    report = stages.preflight.run(cfg, folder)
    typer.echo(report.summary())
    if not report.passed:
        raise _fail("preflight gate failed", EXIT_GATE)
    stages.tokenize.run(cfg, folder)
    stages.train.run(cfg, folder, on_poll=_progress(folder))
    stages.evaluate.run(cfg, folder)
    stages.register.run(cfg, folder, folder.name)
    typer.echo(stages.register.summary(folder))
    typer.echo(RunFolder(folder).registry_record)


@app.command()
@_guard
def summary(run_dir: Annotated[Path | None, typer.Argument(help="Run folder (default: newest registered run)")] = None) -> None:
    """Print what a run produced: model version, alias, validation loss vs baseline."""
    if run_dir is None:
        done = sorted((f for f in run_folder.run_folders() if f.registry_record.exists()),
                      key=lambda f: f.registry_record.stat().st_mtime)
        if not done:
            raise _fail(f"no registered run under {run_folder.runs_root()}", EXIT_INPUT)
        run_dir = done[-1].root
    typer.echo(stages.register.summary(run_dir))


@app.command()
@_guard
def generate(model: Annotated[str, typer.Argument(help="models:/NAME@ALIAS, models:/NAME/VERSION, or a model folder")],
             prompt: Annotated[list[str], typer.Option("--prompt", "-p", help="Prompt (repeatable)")],
             max_new_tokens: Annotated[int, typer.Option(min=1)] = 64,
             temperature: Annotated[float, typer.Option(min=0.0, help="0 = greedy")] = 0.8,
             top_k: Annotated[int, typer.Option(min=0, help="0 = all tokens")] = 40,
             seed: int = 0, device: str = "auto") -> None:
    """Continue each prompt with a registered model: weights and tokenizer come from MLflow."""
    for text in stages.evaluate.continuations(model, prompt, max_new_tokens, temperature, top_k or None, seed, device):
        typer.echo(text)


@app.command("render-k8s")
@_guard
def render_k8s(config: ConfigOpt, set: SetOpt = None,
               run_id: Annotated[str | None, typer.Option(help="Run id (default: <name>-<config sha256[:12]>)")] = None,
               nodes: Annotated[int | None, typer.Option(min=1, help="Override compute.nodes")] = None,
               try_number: Annotated[int, typer.Option(min=1, help="Airflow try number")] = 1) -> None:
    """Print the training gang's Kubernetes objects (headless Service, Indexed Job) as YAML.

    Nothing is written and no cluster is contacted: pipe it to ``kubectl apply --dry-run=server -f -``.
    """
    cfg = load_config(config, [*(set or []), *([f"compute.nodes={nodes}"] if nodes else [])])
    run_id = run_id or f"{cfg.name}-{cfg.sha256()[:12]}"
    pod_run_dir = run_folder.named_run_dir(run_id, home=PurePosixPath(cfg.compute.kubernetes.mount_path))
    gang = k8s.render(launch_spec(cfg, pod_run_dir, run_id, try_number), cfg.compute.kubernetes)
    typer.echo(gang.to_yaml(), nl=False)


@app.command()
@_guard
def land(src: Annotated[Path, typer.Argument(help="Folder with train/ and optionally val/")],
         landing: Annotated[str | None, typer.Option(help="Landing zone (default: refresh.landing of the config)")] = None,
         batch_id: Annotated[str | None, typer.Option("--batch-id", help="Batch id (default: UTC time + random)")] = None,
         config: Annotated[Path | None, typer.Option("--config", "-c", help="Config naming refresh.landing "
                                                     "(default: $TAXIWAY_CONFIG)")] = None) -> None:
    """Land new data as a batch for taxiway_refresh: files, then manifest, then the completion marker;
    then, when TAXIWAY_AIRFLOW_URL is set, announce it to Airflow as an asset event."""
    cfg = _land_config(config, required=landing is None)
    if landing is None:
        landing = cfg.refresh.landing
    announce.check()
    batch = zone.land(src, landing, batch_id, fmt=cfg.data.format if cfg else None, limits=cfg.limits if cfg else None)
    typer.echo(f"landed batch {batch.id}: {batch.files} files, {batch.bytes} bytes, manifest sha256 "
               f"{batch.manifest_sha256[:12]}…")
    if announce.configured():
        try:
            event = announce.announce(batch, landing)
        except announce.NotAnnounced as exc:
            typer.echo(f"{batch.uri.rstrip('/')}/{zone.MARKER}")
            raise announce.NotAnnounced(f"batch {batch.id} landed, but {exc}; the refresh's cron will find it") from None
        typer.echo(f"announced: asset event {event['id']} on {event['asset']} at {event['timestamp']}")
    typer.echo(f"{batch.uri.rstrip('/')}/{zone.MARKER}")


def _land_config(config: Path | None, required: bool) -> RunConfig | None:
    """The config naming the landing zone (``refresh.landing``) and the data's format: ``--config``, else
    ``$TAXIWAY_CONFIG``; needed only when ``--landing`` is not given."""
    path = config or (Path(os.environ["TAXIWAY_CONFIG"]) if os.environ.get("TAXIWAY_CONFIG") else None)
    if path is None:
        if required:
            raise BadInput("no landing zone: pass --landing, or --config (or TAXIWAY_CONFIG) with refresh.landing set")
        return None
    cfg = load_config(path)
    if required and not cfg.refresh.landing:
        raise BadInput(f"{path}: refresh.landing is not set; pass --landing")
    return cfg


@app.command()
def schema() -> None:
    """Print the RunConfig JSON schema."""
    typer.echo(json.dumps(RunConfig.model_json_schema(), indent=2))


def main() -> None:
    set_policy()  # glibc's allocator policy, once for the process and its forked workers (pipelines/heap.py)
    logging.Formatter.converter = time.gmtime
    logging.basicConfig(level=logging.INFO, format="%(asctime)sZ %(levelname)s %(name)s: %(message)s",
                        datefmt="%Y-%m-%dT%H:%M:%S")
    sys.exit(app())


if __name__ == "__main__":
    main()
