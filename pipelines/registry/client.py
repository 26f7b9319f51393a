"""The MLflow client and reading model versions: Taxiway's tracking URI, retries for what is
transient, ``models:/`` URIs resolved, and model folders downloaded (checked against the weights
sha256 recorded at registration). The bottom of ``pipelines.registry``: it imports no sibling.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar
from urllib.parse import unquote_plus

from pipelines.config import RegistryConfig
from pipelines.errors import BadInput, Transient
from pipelines.registry import served
from pipelines.run_folder import Cache, cache_dir, mlflow_tracking_uri
from trainer import fsio

log = logging.getLogger("taxiway.registry")

WEIGHTS_TAG = "taxiway.weights_sha256"  # model-version tag: the sha256 of model.safetensors at registration
# query parameters that carry a secret: token=, access_token=, password=, X-Amz-Signature=, api_key=, sig=, …
_SECRET_PARAM = re.compile(r"token|passw|pwd|secret|key|sig|auth|credential|session", re.IGNORECASE)
T = TypeVar("T")


class ModelNotFound(BadInput, LookupError):
    """A models:/ URI names no version, or the version's files are not a Taxiway model."""


class RegistryUnavailable(Transient):
    """MLflow could not be reached (or kept failing transiently) after every retry."""


# --- connecting, with retries for what is transient -------------------------------------------

def redacted(uri: str) -> str:
    """``uri`` fit for logs and error messages: its userinfo and the values of query parameters that
    name a secret become ``***``. All of the userinfo: a token alone (``https://TOKEN@host``) or a
    token as the user name (``https://TOKEN:x-oauth-basic@host``) is as secret as a password."""
    return _without_secrets(uri, mask="***")


def without_credentials(url: str) -> str:
    """``url`` fit for a browser: no userinfo and no secret query parameters at all (masked, they would
    only make the browser ask for a password)."""
    return _without_secrets(url, mask=None)


def _without_secrets(uri: str, mask: str | None) -> str:
    """``uri`` with its userinfo and secret parameters masked (``mask``) or dropped (None).

    The userinfo ends at the last "@" of the authority (how HTTP clients read it) or at the first
    "@" of the URI (how SQLAlchemy reads a database URI: its password may hold "/", "?" or "#"),
    whichever is later: reading a path's "@" as the end of a password hides too much, never too little.
    Parameters are ``name=value`` after "?", "&", ";" or "#" (a token can be in a fragment too)."""
    scheme, sep, rest = uri.partition("://")
    if not sep:
        return uri
    userinfo = ""
    if not rest.startswith("/"):
        authority_end = min((i for i in map(rest.find, "/?#") if i >= 0), default=len(rest))
        if (cut := max(rest.rfind("@", 0, authority_end), rest.find("@"))) >= 0:
            userinfo, rest = (f"{mask}@" if mask else ""), rest[cut + 1:]
    parts = re.split(r"([?&;#])", rest)
    kept, opener = [parts[0]], ""  # opener: a "?" or "#" whose first parameters were dropped
    for separator, param in zip(parts[1::2], parts[2::2], strict=True):
        name = param.partition("=")[0]
        secret = "=" in param and _SECRET_PARAM.search(unquote_plus(name)) is not None
        if secret and mask is None:
            opener = separator if separator in "?#" else opener
            continue
        kept += [separator if separator in "?#" else opener or separator, f"{name}={mask}" if secret else param]
        opener = ""
    return f"{scheme}://{userinfo}{''.join(kept)}"


def _is_database(uri: str) -> bool:
    return uri.split(":", 1)[0].split("+", 1)[0] in ("sqlite", "postgresql", "mysql", "mssql")


def transient(exc: BaseException) -> bool:
    """Worth retrying: the store was unreachable, busy, or rate limiting — not a bad request."""
    import requests  # requests (~70 ms): DAG parse and the CLI's start-up must not pay for it
    import sqlalchemy.exc  # sqlalchemy (~150 ms): the CLI's start-up must not pay for it
    from mlflow.exceptions import MlflowException  # mlflow (~1 s): DAG parse must not pay for it

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, (ConnectionError, TimeoutError, requests.ConnectionError, requests.Timeout,
                             sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError)):
            return True
        if isinstance(seen, MlflowException):
            if seen.error_code in ("TEMPORARILY_UNAVAILABLE", "REQUEST_LIMIT_EXCEEDED"):
                return True
            if seen.message.startswith("API request to") and "failed with exception" in seen.message:
                return True  # the REST client ran out of its own retries on a connection error
        seen = seen.__cause__ or seen.__context__
    return False


def with_retries(reg: RegistryConfig, what: str, fn: Callable[[], T]) -> T:
    """``fn()``, retried with doubling back-off while it fails transiently; then a clear error."""
    delay = reg.retry_backoff_s
    for attempt in range(reg.retries + 1):
        try:
            return fn()
        except Exception as exc:
            if not transient(exc):
                raise
            brief = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
            if attempt == reg.retries:
                raise RegistryUnavailable(
                    f"MLflow at {redacted(mlflow_tracking_uri())} unavailable: {what} failed {attempt + 1} times "
                    f"(registry.retries={reg.retries}); last error: {brief}") from None
            log.warning("%s: MLflow unavailable (%s); retry %d/%d in %.1f s", what, brief, attempt + 1,
                        reg.retries, delay)
            time.sleep(delay)
            delay = min(delay * 2, 60.0)
    raise AssertionError("unreachable")


def _ping(uri: str) -> None:
    """Fail fast (and transiently) when the store is down, instead of waiting out MLflow's own HTTP retries."""
    if uri.startswith("sqlite:"):
        return
    if _is_database(uri):
        import sqlalchemy  # sqlalchemy (~150 ms): the CLI's start-up must not pay for it

        engine = sqlalchemy.create_engine(uri, connect_args={"connect_timeout": 10}, poolclass=sqlalchemy.NullPool)
        try:
            with engine.connect():
                pass
        finally:
            engine.dispose()
    elif uri.startswith(("http://", "https://")):
        import requests  # requests (~70 ms): DAG parse and the CLI's start-up must not pay for it

        response = requests.get(f"{uri.rstrip('/')}/health", timeout=10)
        if response.status_code >= 500 or response.status_code == 429:
            raise ConnectionError(f"{redacted(uri)}/health answered HTTP {response.status_code}")


def client():
    """A client bound to Taxiway's tracking URI, without touching MLflow's process-wide default;
    raises a transient error at once when the store is unreachable."""
    from mlflow import MlflowClient  # mlflow (~1 s): DAG parse must not pay for it

    uri = mlflow_tracking_uri()
    _ping(uri)
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


# --- reading models -------------------------------------------------------------------------------

def parse_models_uri(uri: str) -> tuple[str, str | None, str | None]:
    """``models:/NAME/VERSION`` or ``models:/NAME@ALIAS`` → (name, version, alias)."""
    if not uri.startswith("models:/"):
        raise BadInput(f"{uri!r}: expected models:/NAME/VERSION or models:/NAME@ALIAS")
    body = uri[len("models:/"):]
    if "@" in body:
        name, alias = body.split("@", 1)
        return name, None, alias
    name, _, version = body.partition("/")
    if not name or not version:
        raise BadInput(f"{uri!r}: expected models:/NAME/VERSION or models:/NAME@ALIAS")
    return name, version, None


def resolve_version(uri: str, reg: RegistryConfig | None = None):
    """The ModelVersion a models:/ URI names; a clear error when it does not exist."""
    from mlflow.exceptions import MlflowException  # mlflow (~1 s): DAG parse must not pay for it

    reg = reg or RegistryConfig()
    name, version, alias = parse_models_uri(uri)

    def get():
        c = client()
        return c.get_model_version_by_alias(name, alias) if alias else c.get_model_version(name, version)

    try:
        return with_retries(reg, f"resolve {uri}", get)
    except MlflowException as exc:
        raise ModelNotFound(f"{uri}: no such model version ({exc.message})") from None


def download(mv, dest: Path, reg: RegistryConfig | None = None) -> Path:
    """The version's model folder, ``dest/<name>-v<version>``: downloaded once into a staging
    folder and renamed, so a retried task reuses a complete copy and never a partial one. The
    weights are checked against the sha256 recorded at registration."""
    import mlflow  # mlflow (~1 s): DAG parse must not pay for it
    from mlflow.exceptions import MlflowException  # mlflow (~1 s): DAG parse must not pay for it

    final = dest / f"{mv.name}-v{mv.version}"
    if (final / "model.safetensors").is_file():
        return final
    dest.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".download.", dir=dest))
    where = f"models:/{mv.name}/{mv.version}"
    try:
        try:
            got = served.model_folder(Path(with_retries(
                reg or RegistryConfig(), f"download {where}", lambda: mlflow.artifacts.download_artifacts(
                    artifact_uri=mv.source, dst_path=str(tmp), tracking_uri=mlflow_tracking_uri()))))
        except (MlflowException, OSError) as exc:
            raise Transient(f"{where}: its files at {mv.source} cannot be downloaded ({exc})") from None
        if not (got / "model.safetensors").is_file():
            raise ModelNotFound(f"{where}: no model.safetensors in {mv.source}")
        expected = (mv.tags or {}).get(WEIGHTS_TAG)
        if expected and fsio.sha256_file(got / "model.safetensors") != expected:
            raise ModelNotFound(f"{where}: model.safetensors at {mv.source} does not match the sha256 recorded "
                              f"at registration ({expected[:12]}…); the stored copy is corrupt")
        os.rename(got, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def fetch_model(uri: str, reg: RegistryConfig | None = None) -> tuple[Path, str | None]:
    """A model folder to load, and the weights sha256 recorded at registration: a models:/ URI is
    downloaded once into ``$TAXIWAY_HOME/cache/models``; an existing folder is used as it is."""
    if not uri.startswith("models:/") and Path(uri).is_dir():
        return Path(uri), None
    mv = resolve_version(uri, reg)
    return download(mv, Cache(cache_dir()).models, reg), (mv.tags or {}).get(WEIGHTS_TAG)


CHECKPOINT_ARTIFACT = "checkpoint"


def download_checkpoint(mv, dest: Path, reg: RegistryConfig) -> Path | None:
    """The full checkpoint logged with the version (``registry.log_checkpoint``), as ``dest``, or
    None when it has none or the copy fails its checksums. Staged and renamed like ``download``."""
    from mlflow.exceptions import MlflowException  # mlflow (~1 s): DAG parse must not pay for it

    from trainer import checkpoint  # torch (~1 s): DAG parse must not pay for it

    if (dest / "checksums.json").is_file():
        return dest
    c = client()
    if not mv.run_id or not with_retries(reg, "list the checkpoint", lambda: c.list_artifacts(mv.run_id, CHECKPOINT_ARTIFACT)):
        return None
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".checkpoint.", dir=dest.parent))
    try:
        try:
            got = Path(with_retries(reg, "download the checkpoint",
                                    lambda: c.download_artifacts(mv.run_id, CHECKPOINT_ARTIFACT, str(tmp))))
        except (MlflowException, OSError) as exc:
            raise Transient(f"models:/{mv.name}/{mv.version}: its checkpoint cannot be downloaded ({exc})") from None
        ok, why = checkpoint.is_valid(got)
        if not ok:
            log.warning("models:/%s/%s: the logged checkpoint is unusable (%s)", mv.name, mv.version, why)
            return None
        os.rename(got, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest

