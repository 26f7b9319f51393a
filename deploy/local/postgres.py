"""The PostgreSQL that tests use: a private server of the test session (deploy/local/services.py), Debian's
binaries on a free loopback port, trust auth, superuser ``taxiway``; fresh databases of its own,
created and dropped by name, and their SQLAlchemy URIs. Its data is thrown away with the session, so
it never syncs to disk.

Not pytest-postgresql (10.0): its executor runs initdb and pg_ctl as the current user, but
PostgreSQL refuses to run as root, which CI is; its data folder lies in pytest's basetemp, which no
other user may enter; and it starts a server per xdist worker. Run as root, here the server is
Debian's ``postgres`` user.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import services

USER = "taxiway"
SETTINGS = {"listen_addresses": "'127.0.0.1'", "unix_socket_directories": "''", "fsync": "off",
            "synchronous_commit": "off", "full_page_writes": "off"}


def _bin() -> Path:
    """The newest PostgreSQL major version installed (Debian's postgresql-<N> packages)."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    if not found:
        raise RuntimeError("no /usr/lib/postgresql/<N>/bin/initdb: `make services` installs Debian's postgresql")
    return found[-1].parent


def _start(folder: Path) -> dict:
    """initdb, then pg_ctl start on a free port; the address is the port, and how to stop it."""
    as_owner = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    if as_owner:
        shutil.chown(folder, "postgres", "postgres")
    pg, data = _bin(), folder / "data"
    made = subprocess.run([*as_owner, pg / "initdb", "-D", data, "-U", USER, "--auth=trust", "--no-locale",
                           "--encoding=UTF8", "--no-sync"], capture_output=True, text=True, cwd=folder)
    if made.returncode:
        raise RuntimeError(f"initdb failed:\n{made.stdout}{made.stderr}")
    with open(data / "postgresql.conf", "a") as conf:
        conf.writelines(f"{key} = {value}\n" for key, value in SETTINGS.items())

    def on(port: int) -> dict | None:
        log = folder / f"server-{port}.log"
        started = subprocess.run([*as_owner, pg / "pg_ctl", "start", "-w", "-t", "120", "-D", data, "-l", log,
                                  "-o", f"-p {port}"], capture_output=True, text=True, cwd=folder)
        if started.returncode == 0:
            return {"port": port, "stop": [*as_owner, str(pg / "pg_ctl"), "stop", "-D", str(data), "-m", "immediate"]}
        said = log.read_text(errors="replace") if log.exists() else ""
        if "Address already in use" in said:
            return None
        raise RuntimeError(f"PostgreSQL did not start:\n{started.stderr}\n{said[-3000:]}")

    return services.on_free_port(on)


@functools.cache
def port() -> int:
    """The session's server's port, started on first use."""
    return services.shared("postgres", _start)["port"]


def admin():
    """An autocommit connection to the admin database (CREATE/DROP DATABASE cannot run in a transaction)."""
    import psycopg2

    conn = psycopg2.connect(host="127.0.0.1", port=port(), user=USER, dbname="postgres", connect_timeout=3)
    conn.autocommit = True
    return conn


def create_db(name: str) -> None:
    conn = admin()
    conn.cursor().execute(f"CREATE DATABASE {name}")
    conn.close()


def drop_db(name: str) -> None:
    """Dropped even while something (a server the test started) is still connected to it."""
    conn = admin()
    cur = conn.cursor()
    cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
    cur.execute(f"DROP DATABASE IF EXISTS {name}")
    conn.close()


def pg_uri(db: str) -> str:
    return f"postgresql+psycopg2://{USER}@127.0.0.1:{port()}/{db}"


@contextlib.contextmanager
def fresh_db(prefix: str = "taxiway_test") -> Iterator[str]:
    """A new database's name, dropped on exit. A server that cannot start fails the test, with its log:
    CI must not go green without the tests that need it."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    create_db(name)
    try:
        yield name
    finally:
        drop_db(name)
