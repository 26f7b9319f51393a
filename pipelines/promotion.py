"""Who holds ``champion``: moved from X to Y only when Y's gate passed against X, atomically.

Two runs can finish together, each having beaten the champion it was evaluated against. The
invariant that keeps ``champion`` off the worse model: under a lock, read the current champion;
set the alias to the candidate only if that is still the model the candidate was evaluated
against (none: the floor). Otherwise the champion moved meanwhile, so the candidate is
evaluated again against the new champion, outside the lock, and tries again. Every move of the
alias is thus a gate decision between exactly the two models involved.

The lock matches the tracking store: an advisory lock (PostgreSQL) or ``flock`` on a file beside
the database (SQLite) — both released by the database or the kernel if the holder dies — and,
behind an MLflow server, a registered model used as a mutex (creation is atomic; a lease lets a
waiter break the lock of a holder that died).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.config import RegistryConfig
from pipelines.errors import BadInput, Transient
from pipelines.run_folder import mlflow_tracking_uri

log = logging.getLogger("taxiway.promotion")

CHAMPION_TAG = "taxiway.champion_version"  # registered-model tag: the version Taxiway last made champion
LEASE_S = 120.0


class ChampionMissing(BadInput):
    """The champion alias is gone because its version was deleted: refuse to guess a baseline."""


class LockTimeout(Transient):
    """The champion lock stayed taken for longer than ``registry.lock_timeout_s``."""


@dataclass(frozen=True)
class Outcome:
    alias: str
    reason: str


# --- the champion as it is now ---------------------------------------------------------------------

def _absent(exc: Exception) -> bool:
    code, msg = getattr(exc, "error_code", ""), getattr(exc, "message", "")
    return code == "RESOURCE_DOES_NOT_EXIST" or (code == "INVALID_PARAMETER_VALUE" and "not found" in msg)


def current_champion(c, name: str, alias: str, missing_ok: bool = False):
    """The version holding ``alias``; None when no version ever did (or a person removed the
    alias). ``ChampionMissing`` when the alias vanished with its deleted version, unless ``missing_ok``."""
    from mlflow.exceptions import MlflowException

    try:
        return c.get_model_version_by_alias(name, alias)
    except MlflowException as exc:
        if not _absent(exc):
            raise
    try:
        last = c.get_registered_model(name).tags.get(CHAMPION_TAG)
    except MlflowException as exc:
        if _absent(exc):
            return None
        raise
    if last is None or missing_ok:
        return None
    try:
        c.get_model_version(name, last)
        return None  # the version is there: the alias was removed on purpose
    except MlflowException as exc:
        if not _absent(exc):
            raise
    raise ChampionMissing(
        f"models:/{name}@{alias}: the champion, version {last}, was deleted and its alias with it, so there is "
        f"nothing to evaluate against. Point the alias at the version to beat "
        f"(MlflowClient().set_registered_model_alias({name!r}, {alias!r}, VERSION)), or run with "
        f"eval.baseline=floor to start over from the floor")


# --- locks ------------------------------------------------------------------------------------------

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


# --- moving the aliases -------------------------------------------------------------------------------

def _evaluated_against(report: dict[str, Any], name: str) -> str | None:
    """The champion this report's gate decided against: None for the floor, a version of ``name``,
    or a marker that matches no champion (a baseline from elsewhere)."""
    base = report["baseline"]
    if base["kind"] == "floor":
        return None
    return str(base["version"]) if base.get("name") == name else f"{base.get('name')}/{base.get('version')}"


def _challenger(reg: RegistryConfig, version: str, reason: str) -> Outcome:
    """``challenger`` for a version that did not win — unless it already is the champion (the same
    run registered again, evaluated against itself): that keeps its alias."""
    from pipelines.registry import client, with_retries

    def mark() -> Outcome:
        c = client()
        mv = current_champion(c, reg.model_name, reg.champion_alias, missing_ok=True)
        if mv is not None and str(mv.version) == version:
            return Outcome(reg.champion_alias, f"already the champion; this evaluation: {reason}")
        c.set_registered_model_alias(reg.model_name, reg.challenger_alias, version)
        c.set_model_version_tag(reg.model_name, version, "taxiway.alias_reason", reason[:5000])
        return Outcome(reg.challenger_alias, reason)

    return with_retries(reg, "set the challenger alias", mark)


def _compare_and_set(reg: RegistryConfig, version: str, expected: str | None,
                     report: dict[str, Any]) -> tuple[bool, str | None]:
    """Under the lock: make ``version`` champion if the champion is still ``expected``.
    Returns (done, the champion found)."""
    from pipelines.registry import client

    name, alias = reg.model_name, reg.champion_alias
    c = client()
    with champion_lock(c, name, reg.lock_timeout_s):
        mv = current_champion(c, name, alias, missing_ok=report["baseline"]["kind"] == "floor")
        found = str(mv.version) if mv is not None else None
        if found == version:
            return True, found  # a retried task: this version already won
        if found != expected:
            return False, found
        c.set_registered_model_alias(name, alias, version)
        c.set_registered_model_tag(name, CHAMPION_TAG, version)
        c.set_model_version_tag(name, version, "taxiway.replaced_champion",
                                f"models:/{name}/{found}" if found else "none (floor)")
        c.set_model_version_tag(name, version, "taxiway.alias_reason", report["reason"][:5000])
        return True, found


def promote(reg: RegistryConfig, version: str, report: dict[str, Any],
            reevaluate: Callable[[str, int], dict[str, Any]] | None) -> Outcome:
    """``champion`` if the gate passed against the current champion, else ``challenger``;
    re-evaluates (at most ``registry.max_reevaluations`` times) when the champion moved."""
    from pipelines.registry import with_retries

    name = reg.model_name
    for attempt in range(reg.max_reevaluations + 1):
        if not report["passed"]:
            return _challenger(reg, version, report["reason"])
        expected = _evaluated_against(report, name)
        done, found = with_retries(reg, "move the champion alias",
                                   lambda r=report, e=expected: _compare_and_set(reg, version, e, r))
        if done:
            return Outcome(reg.champion_alias, report["reason"])
        if reevaluate is None or attempt == reg.max_reevaluations:
            break
        log.info("champion of %s is version %s, not %s as evaluated: evaluating again against it",
                 name, found, expected or "none (floor)")
        report = reevaluate(f"models:/{name}/{found}" if found else "floor", attempt + 1)
    return _challenger(reg, version, f"not promoted: the champion moved to version {found} while this model "
                                     f"was evaluated against {expected or 'the floor'}; evaluate it again")
