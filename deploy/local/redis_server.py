"""The Redis that tests use (the Celery broker): a private ``redis-server`` of the test session
(deploy/local/services.py), Debian's binary on a free loopback port, nothing kept on disk.

Not pytest-redis (5.0): its factory cannot switch snapshots off (an empty ``save`` is dropped, so
Redis saves on its default schedule), always passes ``--timeout`` (15 s unless set, and 0 is
dropped too: idle clients, Celery's among them, cut off), and starts a server per xdist worker.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
from pathlib import Path

import services
from live_airflow import wait_for


def _start(folder: Path) -> dict:
    """A daemonized redis-server; the address is the port, and how to stop it."""
    import redis

    if shutil.which("redis-server") is None:
        raise RuntimeError("no redis-server: `make services` installs Debian's redis-server")

    def on(port: int) -> dict | None:
        log = folder / f"server-{port}.log"
        subprocess.run(["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
                        "--daemonize", "yes", "--dir", str(folder), "--logfile", str(log),
                        "--pidfile", str(folder / f"redis-{port}.pid")], check=True, capture_output=True)

        def state() -> str | None:
            """"taken" when it could not bind, "up" when it answers (itself, not a server that took the port first)."""
            if log.exists() and "Address already in use" in log.read_text(errors="replace"):
                return "taken"
            try:
                with redis.Redis(host="127.0.0.1", port=port, socket_timeout=1) as client:
                    return "up" if Path(client.config_get("dir")["dir"]) == folder.resolve() else None
            except redis.RedisError:
                return None

        if wait_for(f"redis-server on port {port} (log: {log})", state, 30, every_s=0.05) == "taken":
            return None
        return {"port": port, "stop": ["redis-cli", "-p", str(port), "shutdown", "nosave"]}

    return services.on_free_port(on)


@functools.cache
def port() -> int:
    """The session's server's port, started on first use."""
    return services.shared("redis", _start)["port"]


def redis_url(db: int = 0) -> str:
    return f"redis://127.0.0.1:{port()}/{db}"
