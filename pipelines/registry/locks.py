"""The lock that serializes reads and moves of a model's ``champion`` alias, matched to the tracking
store: an advisory lock (PostgreSQL) or ``flock`` on a file beside the database (SQLite) — both
released by the database or the kernel if the holder dies — and, behind an MLflow server, a
registered model used as a mutex (creation is atomic; a lease lets a waiter break the lock of a
holder that died).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from pipelines.errors import Transient
from pipelines.run_folder import mlflow_tracking_uri

log = logging.getLogger("taxiway.promotion")

LEASE_S = 120.0


class LockTimeout(Transient):
    """The champion lock stayed taken for longer than ``registry.lock_timeout_s``."""


def _key(name: str) -> str:
    return f"taxiway-champion:{name}"


@contextlib.contextmanager
def file_lock(path: Path, timeout_s: float) -> Iterator[None]:
    """``flock`` on ``path``: released by the kernel when the holder exits, however it exits."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    with open(path, "a+") as fh:
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise LockTimeout(f"{path}: still locked after {timeout_s:.0f} s") from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@contextlib.contextmanager
def advisory_lock(uri: str, key: str, timeout_s: float) -> Iterator[None]:
    """A PostgreSQL session advisory lock on its own connection: the server releases it when the
    connection ends, so a holder that dies never leaves it taken."""
    import sqlalchemy

    lock_id = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big", signed=True)
    engine = sqlalchemy.create_engine(uri, poolclass=sqlalchemy.NullPool, connect_args={"connect_timeout": 10})
    try:
        with engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            deadline = time.monotonic() + timeout_s
            while not conn.execute(sqlalchemy.text("SELECT pg_try_advisory_lock(:k)"), {"k": lock_id}).scalar():
                if time.monotonic() > deadline:
                    raise LockTimeout(f"advisory lock {key!r} still held after {timeout_s:.0f} s")
                time.sleep(0.05)
            try:
                yield
            finally:
                conn.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:k)"), {"k": lock_id})
    finally:
        engine.dispose()


@contextlib.contextmanager
def registry_lock(c, key: str, timeout_s: float, lease_s: float = LEASE_S) -> Iterator[None]:
    """The registered model ``key`` as a mutex (for an MLflow server, where no database
    is at hand): creating it is atomic, so one process holds it. It carries its holder and the
    end of its lease; a waiter deletes a lock whose lease ran out (its holder died)."""
    from mlflow.exceptions import MlflowException

    me = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    deadline = time.monotonic() + timeout_s
    while True:
        expires = int((time.time() + lease_s) * 1000)
        try:
            c.create_registered_model(key, tags={"holder": me, "expires_ms": str(expires)},
                                      description="Taxiway champion lock; safe to delete when its lease ran out")
            break
        except MlflowException as exc:
            # DOES_NOT_EXIST: the create collided, and the holder released before the store's own
            # lookup for its "already exists" message — held a moment ago, so wait like for a holder
            if exc.error_code not in ("RESOURCE_ALREADY_EXISTS", "RESOURCE_DOES_NOT_EXIST"):
                raise
        with contextlib.suppress(MlflowException):
            held = c.get_registered_model(key)
            if int(held.tags.get("expires_ms", "0")) < time.time() * 1000:
                log.warning("breaking the champion lock of %s: its lease ran out", held.tags.get("holder"))
                c.delete_registered_model(key)
                continue
        if time.monotonic() > deadline:
            raise LockTimeout(f"registry lock {key!r} still held after {timeout_s:.0f} s")
        time.sleep(0.2)
    try:
        yield
    finally:
        with contextlib.suppress(MlflowException):
            if c.get_registered_model(key).tags.get("holder") == me:
                c.delete_registered_model(key)


def champion_lock(c, name: str, timeout_s: float) -> contextlib.AbstractContextManager[None]:
    """The lock serializing reads and moves of ``name``'s champion alias, for this tracking store."""
    uri = mlflow_tracking_uri()
    scheme = uri.split(":", 1)[0].split("+", 1)[0]
    if scheme == "sqlite":
        from sqlalchemy.engine import make_url

        db = Path(make_url(uri).database or "mlflow.db").resolve()
        digest = hashlib.sha256(name.encode()).hexdigest()[:16]
        return file_lock(db.with_name(f"{db.name}.champion-{digest}.lock"), timeout_s)
    if scheme == "postgresql":
        return advisory_lock(uri, _key(name), timeout_s)
    return registry_lock(c, f"{name}.champion-lock", timeout_s)
