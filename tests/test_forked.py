"""The forked job split used for MinHash signatures and the early-started job of the preflight reduce:
results, errors, dead children, clean-up."""

from __future__ import annotations

import multiprocessing
import os
import signal
from pathlib import Path

import pytest

from pipelines.errors import Transient
from pipelines.preflight.forked import Ahead, split_map


def _children() -> set[int]:
    """Live (or unreaped) child processes of this process, read from /proc (not the module's bookkeeping)."""
    me = str(os.getpid())
    out = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "stat").read_text().rsplit(")", 1)[1].split()[1] == me:
                    out.add(int(entry.name))
            except (FileNotFoundError, ProcessLookupError):
                continue
    return out


@pytest.fixture
def no_new_children():
    """After the test, no child of this process remains that was not there before it (children of
    other tests' helpers, such as a live Airflow, are not this test's business)."""
    before = _children()
    yield
    assert not _children() - before


@pytest.mark.parametrize("workers", [1, 2, 3, 8])
def test_every_item_once_with_its_result(workers: int, no_new_children):
    items = list(range(23))
    # The first two jobs meet at a barrier: they can only both pass when two different processes
    # hold them at once, so the work is really shared (no timing guess about who starts first).
    barrier = multiprocessing.get_context("fork").Barrier(2) if workers > 1 else None

    def job(x: int) -> tuple[int, int]:
        if barrier and x < 2:
            barrier.wait(timeout=120)
        return x * x, os.getpid()

    got = list(split_map(job, items, workers))
    assert sorted(i for i, _ in got) == items
    assert all(result[0] == items[i] ** 2 for i, result in got)
    pids = {result[1] for _, result in got}
    assert (len(pids) > 1) == (workers > 1)
    if workers == 2:  # caller + one child: the barrier needs both
        assert os.getpid() in pids  # the caller works too


class Bad(ValueError):
    pass


def _in_child(action):
    """A job that runs ``action`` when it is computed in a child process. The caller's jobs wait
    until a child has started one, so a child surely runs ``action`` however the claims fall."""
    parent, child_started = os.getpid(), multiprocessing.get_context("fork").Event()

    def job(x: int) -> int:
        if os.getpid() == parent:
            assert child_started.wait(timeout=120), "no child ever claimed a job"
            return x
        child_started.set()
        action()
        return x
    return job


def _raise(exc: BaseException):
    def action():
        raise exc
    return action


def test_a_childs_exception_is_raised_in_the_caller(no_new_children):
    with pytest.raises(Bad, match="in a child"):
        list(split_map(_in_child(_raise(Bad("in a child"))), list(range(20)), 2))


def test_an_exception_that_does_not_pickle_arrives_as_its_repr(no_new_children):
    class Local(Exception):  # a local class cannot be pickled
        pass

    with pytest.raises(RuntimeError, match="Local"):
        list(split_map(_in_child(_raise(Local("x"))), list(range(20)), 2))


def test_a_child_that_dies_is_an_error_naming_the_signal(no_new_children):
    with pytest.raises(Transient, match="died without a result.*SIGKILL"):
        list(split_map(_in_child(lambda: os.kill(os.getpid(), signal.SIGKILL)), list(range(20)), 2))


def test_the_callers_own_failure_kills_and_reaps_the_children(no_new_children):
    """The children are busy (blocked in a job) when the caller fails: they must be killed, not awaited."""
    parent, never = os.getpid(), multiprocessing.get_context("fork").Event()

    def job(x: int) -> int:
        if os.getpid() == parent:
            raise Bad("caller's share")
        never.wait(timeout=600)
        return x

    with pytest.raises(Bad):
        list(split_map(job, list(range(50)), 3))


@pytest.mark.parametrize("enabled", [True, False])
def test_ahead_warms_up_at_once_in_a_child_and_runs_the_job_on_what_is_sent_later(enabled: bool, no_new_children):
    caller = os.getpid()
    prepared = multiprocessing.get_context("fork").Event()
    with Ahead(prepared.set, lambda x: (x * 2, os.getpid()), enabled) as ahead:
        if enabled:  # prepared before anything was sent: the caller has not asked for the result yet
            assert prepared.wait(timeout=120)
        ahead.submit(21)
        value, pid = ahead.result()
    assert value == 42 and (pid != caller) == enabled and prepared.is_set() == enabled


def test_ahead_raises_the_childs_exception_and_names_a_dead_child(no_new_children):
    with Ahead(lambda: None, lambda x: _raise(Bad("in the job"))(), True) as ahead, pytest.raises(Bad, match="in the job"):
        ahead.submit(1)
        ahead.result()
    with Ahead(lambda: os.kill(os.getpid(), signal.SIGKILL), lambda x: x, True) as ahead, \
            pytest.raises(Transient, match="died without a result.*SIGKILL"):
        ahead.submit(1)
        ahead.result()


def test_ahead_is_killed_and_reaped_when_the_caller_fails_first(no_new_children):
    never = multiprocessing.get_context("fork").Event()
    with pytest.raises(Bad), Ahead(lambda: never.wait(timeout=600), lambda x: x, True):
        raise Bad("caller")


def test_before_runs_in_the_caller_while_the_children_take_jobs(no_new_children):
    caller, child_working = os.getpid(), multiprocessing.get_context("fork").Event()
    ran = []

    def job(x: int) -> int:
        if os.getpid() != caller:
            child_working.set()
        return x

    def before() -> None:
        ran.append(os.getpid())
        assert child_working.wait(timeout=120)  # the children were started first

    assert sorted(i for i, _ in split_map(job, list(range(10)), 2, before=before)) == list(range(10))
    assert ran == [caller]
    assert [i for i, _ in split_map(job, list(range(10)), 1, before=before)] == list(range(10)) and ran == [caller]
