"""The three failure kinds mean the same on the CLI (exit 2 / 1 / 3) and in Airflow (fail at once /
fail at once / retry): the classification, the Airflow translation, and the CLI's exit codes."""

from __future__ import annotations

import pytest

from conftest import TINY, taxiway
from pipelines.errors import BadInput, CheckFailed, Transient, kind_of


def _cases():
    from pipelines.config import ConfigError
    from pipelines.documents import DocumentError
    from pipelines.launch.local import GangFailed, GangTimedOut
    from pipelines.manifest import ManifestError
    from pipelines.registry import ChampionMissing, LockTimeout, ModelNotFound, RegistryUnavailable
    from pipelines.roots import OutOfBounds
    from pipelines.stages.prepare import StageInputError
    from pipelines.stages.train import SmokeFailed
    from pipelines.storage import StorageError
    from pipelines.tokenize.bpe import TokenizerError

    return [
        (ConfigError({"train.lr": "must be > 0"}, "x.yaml"), BadInput), (ManifestError("m"), BadInput),
        (DocumentError("d"), BadInput), (TokenizerError("t"), BadInput), (StorageError("s"), BadInput),
        (OutOfBounds("o"), BadInput), (StageInputError("s"), BadInput), (ChampionMissing("c"), BadInput),
        (ModelNotFound("m"), BadInput), (SmokeFailed("s"), CheckFailed), (GangTimedOut("g"), CheckFailed),
        (RegistryUnavailable("r"), Transient), (LockTimeout("l"), Transient), (GangFailed("g"), Transient),
        # what eval/, trainer/ and libraries raise, classified as Python spells it
        (ValueError("v"), BadInput), (KeyError("k"), None), (IndexError("i"), None), (FileNotFoundError("f"), BadInput),
        (ConnectionRefusedError("c"), Transient), (TimeoutError("t"), Transient),
        (RuntimeError("a bug"), None), (ZeroDivisionError(), None),
    ]


def test_every_error_has_one_kind():
    for exc, kind in _cases():
        assert kind_of(exc) is kind, (exc, kind_of(exc), kind)
    assert (BadInput.exit_code, CheckFailed.exit_code, Transient.exit_code) == (2, 1, 3)
    assert [k.retry for k in (BadInput, CheckFailed, Transient)] == [False, False, True]


def test_airflow_fails_input_and_checks_at_once_and_retries_the_rest():
    from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

    from taxiway_airflow.failures import translated

    def raising(exc: BaseException):
        @translated
        def task() -> None:
            raise exc
        return task

    for exc, kind in _cases():
        expected = AirflowFailException if kind in (BadInput, CheckFailed) else type(exc)
        with pytest.raises(expected) as info:
            raising(exc)()
        if expected is AirflowFailException:
            assert str(info.value).startswith(kind.label) and info.value.__cause__ is exc
    with pytest.raises(AirflowSkipException):  # Airflow's own control flow passes untouched
        raising(AirflowSkipException("nothing new"))()


def test_cli_exit_codes_follow_the_kinds(tmp_path):
    """Bad input here; a failed gate exits 1 in tests/test_cli.py and tests/test_preflight.py, an
    unreachable tracking server exits 3 in tests/test_registry.py (after the registry's retries)."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"extends: {TINY}\ntrain:\n  lr: -1\n")
    proc = taxiway("preflight", "-c", str(bad))
    assert proc.returncode == 2 and "train.lr" in proc.stderr and "Traceback" not in proc.stderr
