"""The forked job split used for MinHash signatures: results, errors, dead children, clean-up."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from pipelines.errors import Transient
from pipelines.preflight.forked import split_map


def _children() -> list[int]:
    """Live (or unreaped) child processes of this process."""
    me = str(os.getpid())
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "stat").read_text().rsplit(")", 1)[1].split()[1] == me:
                    out.append(int(entry.name))
            except (FileNotFoundError, ProcessLookupError):
                continue
    return out


@pytest.mark.parametrize("workers", [1, 2, 3, 8])
def test_every_item_once_with_its_result(workers: int):
    items = list(range(23))

    def job(x: int) -> tuple[int, int]:
        time.sleep(0.02)  # long enough that every process gets a share
        return x * x, os.getpid()

    got = list(split_map(job, items, workers))
    assert sorted(i for i, _ in got) == items
    assert all(result[0] == items[i] ** 2 for i, result in got)
    pids = {result[1] for _, result in got}
    assert (len(pids) > 1) == (workers > 1)
    if workers == 2:  # with more children they may claim every job while the caller still forks
        assert os.getpid() in pids  # the caller works too
    assert not _children()


class Bad(ValueError):
    pass


def _in_child(action):
    """A job that runs ``action`` when it is computed in a child process."""
    parent = os.getpid()

    def job(x: int) -> int:
        time.sleep(0.005)
        if os.getpid() != parent:
            action()
        return x
    return job


def _raise(exc: BaseException):
    def action():
        raise exc
    return action


def test_a_childs_exception_is_raised_in_the_caller():
    with pytest.raises(Bad, match="in a child"):
        list(split_map(_in_child(_raise(Bad("in a child"))), list(range(20)), 2))
    assert not _children()


def test_an_exception_that_does_not_pickle_arrives_as_its_repr():
    class Local(Exception):  # a local class cannot be pickled
        pass

    with pytest.raises(RuntimeError, match="Local"):
        list(split_map(_in_child(_raise(Local("x"))), list(range(20)), 2))
    assert not _children()


def test_a_child_that_dies_is_an_error_naming_the_signal():
    with pytest.raises(Transient, match="died without a result.*SIGKILL"):
        list(split_map(_in_child(lambda: os.kill(os.getpid(), signal.SIGKILL)), list(range(20)), 2))
    assert not _children()


def test_the_callers_own_failure_kills_and_reaps_the_children():
    parent = os.getpid()

    def job(x: int) -> int:
        time.sleep(0.005)
        if os.getpid() == parent:
            raise Bad("caller's share")
        return x

    with pytest.raises(Bad):
        list(split_map(job, list(range(50)), 3))
    assert not _children()
