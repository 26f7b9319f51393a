"""The lock that serializes reads and moves of a model's ``champion`` alias, matched to the tracking
store: an advisory lock (PostgreSQL) or ``flock`` on a file beside the database (SQLite) — both
released by the database or the kernel if the holder dies — and, behind an MLflow server, a
registered model used as a mutex (creation is atomic; a lease lets one waiter break the lock of a
holder that died).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from pipelines.errors import Transient
from pipelines.run_folder import mlflow_tracking_uri

log = logging.getLogger("taxiway.promotion")

LEASE_S = 120.0
BREAK_LEASE_S = 30.0  # a break token is held for one read and one delete


class LockTimeout(Transient):
    """The champion lock stayed taken for longer than ``registry.lock_timeout_s``."""


def _key(name: str) -> str:
    return f"taxiway-champion:{name}"


@contextlib.contextmanager
def file_lock(path: Path, timeout_s: float) -> Iterator[None]:
    """``flock`` on ``path``: released by the kernel when the holder exits, however it exits."""
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
    import sqlalchemy  # sqlalchemy (~150 ms): the CLI's start-up must not pay for it

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


class Lease(NamedTuple):
    """Who holds a registered-model mutex, and until when (ms since the epoch, UTC)."""

    holder: str | None  # None: no mutex (gone, or read halfway through its delete)
    ends_ms: int

    def expired(self) -> bool:
        return self.holder is not None and self.ends_ms < time.time() * 1000


def _new_holder() -> str:
    """A holder id used for one mutex only and never again: the compare-and-set below rests on it."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


def _read(c, name: str) -> Lease:
    from mlflow.exceptions import MlflowException  # mlflow (~1 s): DAG parse must not pay for it

    try:
        tags = c.get_registered_model(name).tags
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        return Lease(None, 0)
    # the store reads a model, then its tags: a read that straddles a delete finds no tags
    return Lease(tags["holder"], int(tags.get("expires_ms", "0"))) if "holder" in tags else Lease(None, 0)


def _take(c, name: str, holder: str, lease_s: float) -> Lease:
    """Create the mutex ``name`` held by ``holder`` until its lease ends; the lease there now, which is
    ``holder``'s when it won (a create whose answer was lost and that the client retried included)."""
    from mlflow.exceptions import MlflowException  # mlflow (~1 s): DAG parse must not pay for it

    ends_ms = int((time.time() + lease_s) * 1000)
    try:
        c.create_registered_model(name, tags={"holder": holder, "expires_ms": str(ends_ms)},
                                  description="Taxiway lock; safe to delete when its lease ran out")
        return Lease(holder, ends_ms)
    except MlflowException as exc:
        # DOES_NOT_EXIST: the create collided, and the holder released before the store's own
        # lookup for its "already exists" message — held a moment ago, so wait like for a holder
        if exc.error_code not in ("RESOURCE_ALREADY_EXISTS", "RESOURCE_DOES_NOT_EXIST"):
            raise
    return _read(c, name)


def _break_token(name: str, holder: str) -> str:
    return f"{name}.break-{hashlib.sha256(holder.encode()).hexdigest()[:12]}"


def _delete_held(c, name: str, holder: str, *, expired_only: bool) -> bool:
    """Delete the mutex ``name`` if ``holder`` still holds it (and, breaking a lease, if that ran out):
    a compare-and-set, which the store has no call for. True when this call deleted it.

    It is decided and done holding the break token for (``name``, ``holder``), itself a mutex that
    one process creates and the others fail to: so one process at a time reads ``holder``'s lock
    and deletes it, and the lock it read is the lock it deletes — only a token's owner deletes
    ``holder``'s lock (the holder's own release takes the token too), and a holder id is never
    reused, so once deleted that lock never comes back for a later owner of the token to delete.
    A token whose owner died mid-break is broken the same way, under a token of its own."""
    from mlflow.exceptions import MlflowException  # mlflow (~1 s): DAG parse must not pay for it

    token = _break_token(name, holder)
    me = _new_holder()
    owner = _take(c, token, me, BREAK_LEASE_S)
    if owner.holder != me:
        if owner.expired():
            _delete_held(c, token, owner.holder, expired_only=True)
        return False
    try:
        held = _read(c, name)
        if held.holder != holder or (expired_only and not held.expired()):
            return False  # released or broken meanwhile (a reader of a stale lease gets here)
        if expired_only:
            log.warning("breaking %s of %s: its lease ran out", name, holder)
        c.delete_registered_model(name)
        return True
    finally:
        with contextlib.suppress(MlflowException):  # left behind, its own lease lets it be broken
            c.delete_registered_model(token)


@contextlib.contextmanager
def registry_lock(c, key: str, timeout_s: float, lease_s: float = LEASE_S) -> Iterator[None]:
    """The registered model ``key`` as a mutex (for an MLflow server, where no database is at
    hand): creating it is atomic, so one process holds it. It carries its holder and the end of
    its lease; exactly one waiter breaks a lock whose lease ran out (its holder died), by a
    compare-and-set (``_delete_held``), then races the others to create it anew.

    A lease is a promise about time: a holder that stalls past its lease (or a breaker past its
    token's), or clocks more than a lease apart, can still see two holders."""
    from mlflow.exceptions import MlflowException  # mlflow (~1 s): DAG parse must not pay for it

    me = _new_holder()
    deadline = time.monotonic() + timeout_s
    while True:
        held = _take(c, key, me, lease_s)
        if held.holder == me:
            break
        if held.expired() and _delete_held(c, key, held.holder, expired_only=True):
            continue
        if time.monotonic() > deadline:
            raise LockTimeout(f"registry lock {key!r} still held after {timeout_s:.0f} s")
        time.sleep(0.2)
    try:
        yield
    finally:
        # under the break token too: a waiter breaking this lease cannot delete a successor's lock
        with contextlib.suppress(MlflowException):  # left behind, the lease lets a waiter break it
            _delete_held(c, key, me, expired_only=False)


def champion_lock(c, name: str, timeout_s: float) -> contextlib.AbstractContextManager[None]:
    """The lock serializing reads and moves of ``name``'s champion alias, for this tracking store."""
    uri = mlflow_tracking_uri()
    scheme = uri.split(":", 1)[0].split("+", 1)[0]
    if scheme == "sqlite":
        from sqlalchemy.engine import make_url  # sqlalchemy (~150 ms): the CLI's start-up must not pay for it

        db = Path(make_url(uri).database or "mlflow.db").resolve()
        digest = hashlib.sha256(name.encode()).hexdigest()[:16]
        return file_lock(db.with_name(f"{db.name}.champion-{digest}.lock"), timeout_s)
    if scheme == "postgresql":
        return advisory_lock(uri, _key(name), timeout_s)
    return registry_lock(c, f"{name}.champion-lock", timeout_s)
