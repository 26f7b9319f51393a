"""`make images`: build docker/{trainer,airflow,mlflow}.Dockerfile with buildah (no daemon) and run each
image's smoke through its entrypoint.

The official bases cannot be pulled here (no Docker Hub), so each is stood in for by an image built from
Debian bookworm's packages (debootstrap, then docker/standin/*.Containerfile) and passed to the Dockerfile
as its BASE_IMAGE build argument: every instruction after FROM really runs. Sources that cannot be
reached here are build arguments too: torch's wheel indexes become PyPI plus /opt/wheels (torch's CPU
wheel), and the trainer asserts a CPU torch (TORCH_CUDA=cpu) instead of CUDA 13.

Caches: the debootstrap tree as a tarball under $TAXIWAY_HOME/images/, the stand-in bases in buildah's
storage, tagged with a hash of what they are built from (a second run reuses both). The three images are
rebuilt on every run, tagged with the git SHA.

Containers run with `--isolation chroot` (crun cannot create containers under this host's hybrid
cgroups) and the host's CA bundle mounted (the network here goes through a TLS proxy); neither goes into
an image.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
CACHE = Path(os.environ.get("TAXIWAY_HOME", REPO / ".taxiway")) / "images"
WHEELS = Path("/opt/wheels")  # torch-2.13.0+cpu; no CUDA wheel can be downloaded here
PYPI = "https://pypi.org/simple"
CA = "/etc/ssl/certs/ca-certificates.crt"
HOST = ["--isolation", "chroot", "--volume", f"{CA}:{CA}:ro"]

# stand-in name -> (what it stands in for, its Containerfile, the stand-in it builds on)
STANDINS = {
    "python": ("python:3.11.16-slim-bookworm", "debian-python.Containerfile", "debian"),
    "pytorch": ("pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime", "pytorch.Containerfile", "python"),
    "airflow": ("apache/airflow:3.3.2-python3.11", "airflow.Containerfile", "python"),
}
# image -> (stand-in base, build arguments for this machine)
IMAGES = {
    "trainer": ("pytorch", {"TORCH_INDEX": PYPI, "TORCH_CUDA": "cpu"}),
    "airflow": ("airflow", {"TORCH_CPU_INDEX": PYPI, "PIP_FIND_LINKS": "/wheels"}),
    "mlflow": ("python", {}),
}


def sh(*cmd: str, capture: bool = False) -> str:
    print("+", " ".join(cmd), flush=True)
    out = subprocess.run(cmd, check=True, text=True, stdout=subprocess.PIPE if capture else None)
    return (out.stdout or "").strip()


def image_exists(name: str) -> bool:
    return subprocess.run(["buildah", "inspect", "--type", "image", name], capture_output=True).returncode == 0


def size(name: str) -> str:
    return sh("buildah", "images", "--format", "{{.Size}}", name, capture=True).splitlines()[0]


# --- stand-in bases ----------------------------------------------------------------------------------

STANDIN_ROWS: list[tuple[str, ...]] = []


def debian() -> str:
    """Debian bookworm (minbase) from debootstrap, imported into buildah. ca-certificates comes with it:
    the builds mount the host's CA bundle over its file, which its own install could not then write."""
    name = "localhost/taxiway-standin/debian:bookworm"
    started = time.monotonic()
    if image_exists(name):
        print(f"cached: {name}")
        STANDIN_ROWS.append((name, "debootstrap --variant=minbase bookworm", size(name), "cached"))
        return name
    tarball = CACHE / "debian-bookworm.tar"
    if not tarball.exists():
        root = CACHE / "debian-bookworm"
        shutil.rmtree(root, ignore_errors=True)
        sh("debootstrap", "--variant=minbase", "--include=ca-certificates", "bookworm", str(root), "http://deb.debian.org/debian")
        sh("sh", "-c", f"rm -rf {root}/var/cache/apt/archives/*.deb {root}/var/lib/apt/lists/*")
        sh("tar", "-C", str(root), "--numeric-owner", "-cf", f"{tarball}.part", ".")
        os.replace(f"{tarball}.part", tarball)
        shutil.rmtree(root)
    else:
        print(f"cached: {tarball}")
    ctr = sh("buildah", "from", "scratch", capture=True)
    sh("buildah", "add", "--quiet", ctr, str(tarball), "/")
    sh("buildah", "config", "--cmd", "/bin/bash", "--env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
       ctr)
    sh("buildah", "commit", "--quiet", "--rm", ctr, name)
    STANDIN_ROWS.append((name, "debootstrap --variant=minbase bookworm", size(name), f"{time.monotonic() - started:.0f} s"))
    return name


def standin(key: str, built: dict[str, str]) -> str:
    """A stand-in base, rebuilt only when its Containerfile, its parent or the constraints change."""
    if key in built:
        return built[key]
    if key == "debian":
        built[key] = debian()
        return built[key]
    official, containerfile, parent = STANDINS[key]
    parent_image = standin(parent, built)
    digest = hashlib.sha256()
    for path in (REPO / "docker/standin" / containerfile, REPO / "requirements/constraints.txt",
                 REPO / "docker/standin/airflow-entrypoint.sh"):
        digest.update(path.read_bytes())
    digest.update(parent_image.encode())
    name = f"localhost/taxiway-standin/{key}:{digest.hexdigest()[:12]}"
    started = time.monotonic()
    if image_exists(name):
        print(f"cached: {name} (stands in for {official})")
        STANDIN_ROWS.append((name, official, size(name), "cached"))
    else:
        sh("buildah", "build", *HOST, "--layers=false", "--volume", f"{WHEELS}:/wheels:ro",
           "--volume", f"{REPO / 'requirements'}:/requirements:ro",
           "--build-arg", f"BASE_IMAGE={parent_image}",
           "-f", str(REPO / "docker/standin" / containerfile), "-t", name, str(REPO / "docker/standin"))
        STANDIN_ROWS.append((name, official, size(name), f"{time.monotonic() - started:.0f} s"))
    built[key] = name
    return name


# --- the smokes, through each image's entrypoint ------------------------------------------------------

def run(image: str, args: list[str], volumes: tuple[str, ...] = (), env: tuple[str, ...] = (),
        background: bool = False) -> subprocess.Popen | str:
    """``buildah run`` the image's entrypoint with ``args`` (buildah run itself ignores ENTRYPOINT)."""
    config = json.loads(subprocess.run(["buildah", "inspect", "--type", "image", image], check=True,
                                       capture_output=True, text=True).stdout)["OCIv1"]["config"]
    entrypoint = config.get("Entrypoint") or []
    ctr = sh("buildah", "from", "--quiet", image, capture=True)
    cmd = ["buildah", "run", *HOST, *[f"--volume={v}" for v in volumes], *[f"--env={e}" for e in env],
           ctr, "--", *entrypoint, *args]
    print("+ buildah run", *volumes, *env, ctr, "--", *entrypoint, *args, flush=True)
    if background:
        proc = subprocess.Popen(cmd, start_new_session=True)
        proc.container = ctr  # type: ignore[attr-defined]
        return proc
    try:
        out = subprocess.run(cmd, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        print(out.stdout, end="", flush=True)
        if out.returncode:
            raise RuntimeError(f"{' '.join(args)}: exit {out.returncode}")
        return out.stdout
    finally:
        subprocess.run(["buildah", "rm", ctr], capture_output=True)


def smoke_trainer(image: str) -> str:
    """5 real training steps on CPU: packed data and the trainer's spec made here with the project's
    own code (tokenize stage, trainer spec), the run folder mounted at the same path."""
    from pipelines import stages
    from pipelines.config import load_config
    from pipelines.run_folder import RunFolder
    home = CACHE / "smoke"
    os.environ["TAXIWAY_HOME"] = str(home)  # the configs' ${TAXIWAY_HOME}, the packed cache
    taxiway = str(Path(sys.executable).parent / "taxiway")
    if not (home / "demo-data/manifest.jsonl").exists():
        sh(taxiway, "demo-data", str(home / "demo-data"), "--max-files", "30", "--force")
    run_dir = home / "runs/image-smoke"
    shutil.rmtree(run_dir, ignore_errors=True)  # the trainer would resume from an earlier run's checkpoint
    overrides = ["compute.nodes=1", "train.steps=5", "train.log_every=1", "checkpoint.every_steps=5"]
    sh(taxiway, "tokenize", "-c", str(REPO / "configs/tiny.yaml"), *[f"--set={o}" for o in overrides],
       "--run-dir", str(run_dir), "--workers", "1")
    cfg = load_config(REPO / "configs/tiny.yaml", overrides)
    spec = stages.train.spec(cfg, run_dir)
    sh("chown", "-R", "10001:0", str(home))  # the image's user reads the cache, writes the run folder
    started = time.monotonic()
    run(image, ["--spec", str(spec)], volumes=(f"{home}:{home}",), env=("OMP_NUM_THREADS=1",))
    records = [json.loads(line) for line in RunFolder(run_dir).metrics.read_text().splitlines()]
    for record in records:
        print("metrics.jsonl:", json.dumps(record))
    losses = " ".join(f"{r['loss']:.4f}" for r in records)
    return f"{stages.train.progress_line(run_dir, time.monotonic() - started)}; loss by step: {losses}"


def smoke_airflow(image: str) -> str:
    """`airflow version`, then the DAG folder parsed as the DAG processor would: with the image's own
    environment (the local launcher on configs/demo.yaml), and with the environment deploy/airflow-values.yaml gives every component
    (TAXIWAY_LAUNCHER=kubernetes, configs/kubernetes.yaml, ...). Zero import errors in both."""
    import yaml
    version = run(image, ["version"]).strip().splitlines()[-1]
    parse = ("import json, os; from airflow.dag_processing.dagbag import DagBag; "
             "bag = DagBag(dag_folder=os.environ['AIRFLOW__CORE__DAGS_FOLDER']); "
             "train = {t.task_id: type(t).__name__ for t in bag.dags['taxiway_train'].tasks if t.task_id.startswith('train.')}; "
             "print(json.dumps({'dags': sorted(bag.dag_ids), 'import_errors': bag.import_errors, 'train': train}))")
    values = yaml.safe_load((REPO / "deploy/airflow-values.yaml").read_text())
    deployed = tuple(f"{e['name']}={e['value']}" for e in values["env"] if "value" in e)
    results = []
    for launcher, env in (("local", ()),
                          ("kubernetes", deployed)):
        out = json.loads(run(image, ["python", "-c", parse], env=env).splitlines()[-1])
        if out["import_errors"] or "taxiway_train" not in out["dags"]:
            raise RuntimeError(f"DagBag with TAXIWAY_LAUNCHER={launcher}: {out}")
        results.append(f"{launcher}: {len(out['dags'])} DAGs ({', '.join(out['dags'])}), 0 import errors, "
                       f"train.gang is {out['train'].get('train.gang')}")
    return f"airflow {version}; DagBag " + "; ".join(results)


def smoke_mlflow(image: str) -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = run(image, [], env=("MLFLOW_BACKEND_STORE_URI=sqlite:////home/mlflow/mlflow.db", "MLFLOW_HOST=127.0.0.1",
                               f"MLFLOW_PORT={port}", "MLFLOW_WORKERS=1"), background=True)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as answer:
                    return f"mlflow server (sqlite) GET /health: {answer.status} {answer.read().decode().strip()}"
            except OSError:
                time.sleep(2)
        raise RuntimeError(f"mlflow server never answered /health (exit {proc.poll()})")
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(30)
        subprocess.run(["buildah", "rm", proc.container], capture_output=True)


SMOKES = {"trainer": smoke_trainer, "airflow": smoke_airflow, "mlflow": smoke_mlflow}


def main() -> int:
    CACHE.mkdir(parents=True, exist_ok=True)
    sha = sh("git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD", capture=True)
    built: dict[str, str] = {}
    rows = []
    for key, (base_key, build_args) in IMAGES.items():
        print(f"\n=== {key} ===", flush=True)
        base = standin(base_key, built)
        name = f"localhost/taxiway-{key}:{sha}"
        args = [f"--build-arg={k}={v}" for k, v in {"BASE_IMAGE": base, **build_args}.items()]
        started = time.monotonic()
        sh("buildah", "build", *HOST, "--layers=false", "--volume", f"{WHEELS}:/wheels:ro", *args,
           "-f", str(REPO / f"docker/{key}.Dockerfile"), "-t", name, str(REPO))
        seconds = time.monotonic() - started
        try:
            result = SMOKES[key](name)
        except Exception as error:  # noqa: BLE001 - reported in the table, and the exit status
            result = f"FAILED: {error}"
        print(f"smoke {key}: {result}", flush=True)
        rows.append((name, f"{base} (for {STANDINS[base_key][0]})", size(name), f"{seconds:.0f} s", result))
    print("\n| stand-in base | stands in for | size | build |\n|---|---|---|---|")
    for row in STANDIN_ROWS:
        print("| " + " | ".join(row) + " |")
    print("\n| image | base used | size | build | smoke |\n|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 1 if any(row[-1].startswith("FAILED") for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
