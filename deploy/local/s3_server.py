"""The S3 API that tests use: moto's standalone server (``moto_server``, PyPI's moto[server]), a
private one of the test session (deploy/local/services.py) on a free loopback port, as PostgreSQL and Redis
are. Clients reach it as they reach any S3-compatible store: ``AWS_ENDPOINT_URL`` and a key pair in
the environment (``env()``), read by botocore for s3fs (data, landing) and for MLflow's boto3
(artifacts) alike. It keeps everything in memory; each test makes a bucket of its own (``bucket()``).
"""

from __future__ import annotations

import functools
import secrets
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import services
from live_airflow import BIN, wait_for

# moto accepts any key pair; these name the test server's and nothing else
_KEYS = {"AWS_ACCESS_KEY_ID": "taxiway-test", "AWS_SECRET_ACCESS_KEY": "taxiway-test-secret",
         "AWS_DEFAULT_REGION": "us-east-1"}


def _start(folder: Path) -> dict:
    """``moto_server`` in a session of its own (it outlives the test process that started it); the
    address is its port, and how to stop it."""

    def on(port: int) -> dict | None:
        log = folder / f"moto-{port}.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen([str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)], stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

        def state() -> str | None:
            """"taken" when it exited (it could not bind), "up" when it answers while alive."""
            if proc.poll() is not None:
                return "taken"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/moto-api/data.json", timeout=1) as resp:
                    return "up" if resp.status == 200 and proc.poll() is None else None
            except (urllib.error.URLError, OSError):
                return None

        if wait_for(f"moto_server on port {port} (log: {log})", state, 60, every_s=0.1) == "taken":
            return None
        return {"port": port, "stop": ["kill", str(proc.pid)]}

    return services.on_free_port(on)


@functools.cache
def endpoint() -> str:
    """The session's server's address, started on first use."""
    return f"http://127.0.0.1:{services.shared('s3', _start)['port']}"


def env() -> dict[str, str]:
    """What an S3 client needs to reach the test server: its endpoint and a key pair."""
    return {**_KEYS, "AWS_ENDPOINT_URL": endpoint()}


def client():
    """A boto3 S3 client of the test server's (MLflow's S3 client too): only S3 tests pay for importing it."""
    import boto3  # see the docstring

    return boto3.client("s3", endpoint_url=endpoint(), region_name=_KEYS["AWS_DEFAULT_REGION"],
                        aws_access_key_id=_KEYS["AWS_ACCESS_KEY_ID"], aws_secret_access_key=_KEYS["AWS_SECRET_ACCESS_KEY"])


def bucket(prefix: str = "taxiway") -> str:
    """A new, empty bucket of the test server's; its name."""
    name = f"{prefix}-{secrets.token_hex(4)}"
    client().create_bucket(Bucket=name)
    return name


def keys(name: str, prefix: str = "") -> list[str]:
    """Every object key in bucket ``name`` under ``prefix``."""
    pages = client().get_paginator("list_objects_v2").paginate(Bucket=name, Prefix=prefix)
    return [obj["Key"] for page in pages for obj in page.get("Contents", [])]
