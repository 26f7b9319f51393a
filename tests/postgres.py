"""The PostgreSQL that tests use, at 127.0.0.1:5432 (trust auth, admin database ``test``): fresh
databases of their own, created and dropped by name, and their SQLAlchemy URIs."""

from __future__ import annotations

import contextlib
import getpass
import os
import uuid
from collections.abc import Iterator

import pytest

PG = {"host": "127.0.0.1", "port": 5432, "dbname": "test", "connect_timeout": 3}


def admin():
    """An autocommit connection to the admin database (CREATE/DROP DATABASE cannot run in a transaction)."""
    import psycopg2

    conn = psycopg2.connect(**PG)
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
    return f"postgresql+psycopg2://{os.environ.get('PGUSER') or getpass.getuser()}@127.0.0.1:5432/{db}"


@contextlib.contextmanager
def fresh_db(prefix: str = "taxiway_test") -> Iterator[str]:
    """A new database's name, dropped on exit. PostgreSQL unreachable is a failure, not a skip: CI
    must not go green without the tests that need it."""
    import psycopg2

    try:
        admin().close()
    except psycopg2.OperationalError as exc:
        pytest.fail(f"PostgreSQL at 127.0.0.1:5432 is unreachable; the PostgreSQL backend tests need it: {exc}")
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    create_db(name)
    try:
        yield name
    finally:
        drop_db(name)
