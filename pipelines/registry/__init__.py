"""MLflow: baselines in, registered model versions with lineage out. Callers import from here.

The modules, each importing only modules listed above it (no circle, no callbacks):

- ``client``: the MLflow client on Taxiway's tracking URI (``client()``, the function, is what this
  package exports under that name), ``with_retries``, ``RegistryUnavailable``, ``ModelNotFound``;
  ``models:/`` URIs resolved and downloaded (``resolve_version``, ``download``, ``fetch_model``).
- ``locks``: the champion lock matched to the store (``flock``, PostgreSQL advisory lock, a
  registered model as mutex behind a server), ``LockTimeout``.
- ``metrics``: ``metrics.jsonl`` as MLflow metrics, and the offset already shipped.
- ``lineage``: what a model was made from: lineage tags, dataset inputs, artifacts to log.
- ``runs``: the pipeline run's MLflow run (``open_run``; ``ship`` sends live metrics into it) and
  ``register``: the run completed and its model version created, idempotent per run key (``log``:
  the run completed without a version, for a sweep's members).
- ``champion``: the model to beat (``resolve_baseline``), and moving ``champion``/``challenger``:
  ``promote`` is one try under the lock and answers ``ChampionMoved`` when the champion moved
  since evaluation. Evaluating again and retrying is the register stage's loop
  (``pipelines.stages.register``), not the registry's.
- ``approval``: ``registry.approval: required``: a version tagged pending, then a person's decision
  (or the timeout) applied under the same rules (``apply``).
- ``sweep``: a sweep's parent run and one child run per member (``log_sweep``); the sweep's
  registration stage (``pipelines.sweep.registration``) imports it by name.
"""

from pipelines.registry import lineage
from pipelines.registry.champion import (
    CHAMPION_TAG,
    Baseline,
    ChampionMissing,
    ChampionMoved,
    Outcome,
    current_champion,
    promote,
    resolve_baseline,
    set_challenger,
)
from pipelines.registry.client import (
    WEIGHTS_TAG,
    ModelNotFound,
    RegistryUnavailable,
    client,
    download,
    download_checkpoint,
    fetch_model,
    parse_models_uri,
    redacted,
    resolve_version,
    with_retries,
)
from pipelines.registry.locks import LockTimeout, champion_lock
from pipelines.registry.metrics import last_record, new_records, shipped_offset
from pipelines.registry.runs import (
    LIVE_TAG,
    RUN_KEY_TAG,
    Registered,
    code_version,
    open_run,
    record_reevaluation,
    register,
    ship,
)

__all__ = ["CHAMPION_TAG", "LIVE_TAG", "RUN_KEY_TAG", "WEIGHTS_TAG", "Baseline", "ChampionMissing", "ChampionMoved",
           "LockTimeout", "ModelNotFound", "Outcome", "Registered", "RegistryUnavailable", "champion_lock", "client",
           "code_version", "current_champion", "download", "download_checkpoint", "fetch_model", "last_record", "lineage", "new_records",
           "open_run", "parse_models_uri", "promote", "record_reevaluation", "redacted", "register",
           "resolve_baseline", "resolve_version", "set_challenger", "ship", "shipped_offset", "with_retries"]
