"""The three kinds of failure, and what the CLI and Airflow do with each.

| kind          | meaning                                   | CLI exit | Airflow                       |
|---------------|-------------------------------------------|----------|-------------------------------|
| ``BadInput``  | the config, data or arguments are wrong   | 2        | fails at once, never retried  |
| ``CheckFailed``| a gate or check said no                  | 1        | fails at once, never retried  |
| ``Transient`` | a service or the machine failed; try again| 3        | retried with back-off         |

Every raise site in ``pipelines`` raises one of them (or a subclass naming the case). The
execution layers below (``eval``, ``trainer``, libraries) cannot import this module; what they raise
is classified by ``kind_of`` the way Python spells it: ``ValueError`` and missing files are bad
input (not ``KeyError``/``IndexError``: those are bugs far more often than input),
``ConnectionError``/``TimeoutError`` transient. Anything else is a bug: the CLI shows its
traceback, Airflow retries it as it would any task failure.
"""

from __future__ import annotations

from typing import ClassVar


class TaxiwayError(Exception):
    """Base of the three kinds; not raised itself."""

    exit_code: ClassVar[int]
    retry: ClassVar[bool]
    label: ClassVar[str]


class BadInput(TaxiwayError, ValueError):
    exit_code, retry, label = 2, False, "bad input"


class CheckFailed(TaxiwayError):
    exit_code, retry, label = 1, False, "check failed"


class Transient(TaxiwayError):
    exit_code, retry, label = 3, True, "transient failure (try again)"


KINDS: tuple[type[TaxiwayError], ...] = (BadInput, CheckFailed, Transient)
_BAD_INPUT_BUILTINS = (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError,
                       IsADirectoryError)
_TRANSIENT_BUILTINS = (ConnectionError, TimeoutError)


def kind_of(exc: BaseException) -> type[TaxiwayError] | None:
    """The kind ``exc`` belongs to; None for an unexpected error (a bug)."""
    for kind in KINDS:
        if isinstance(exc, kind):
            return kind
    if isinstance(exc, _TRANSIENT_BUILTINS):
        return Transient
    if isinstance(exc, _BAD_INPUT_BUILTINS):
        return BadInput
    return None
