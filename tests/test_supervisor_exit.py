"""taxiway_airflow.supervisor_exit against Airflow's real task supervisor class and real processes:
a task process whose sockets are all at end-of-file is waited for, not slept on; one with a socket
still open is not waited for at all."""

from __future__ import annotations

import os
import socket
import time
import weakref

import psutil
import pytest
from airflow.sdk.execution_time.supervisor import PsutilTracker, WatchedSubprocess

from taxiway_airflow import supervisor_exit


@pytest.fixture
def patched(monkeypatch):
    """install() on the real class, undone afterwards (the class is shared by the whole process)."""
    monkeypatch.setattr(WatchedSubprocess, "_check_subprocess_exit", WatchedSubprocess._check_subprocess_exit)
    assert supervisor_exit.install() and supervisor_exit.install()  # idempotent
    yield


def _exiting_child(linger_s: float) -> int:
    """A child that has closed everything it shares with us and takes ``linger_s`` to be reapable:
    the window the race falls in, made long enough to see."""
    pid = os.fork()
    if pid == 0:
        time.sleep(linger_s)
        os._exit(0)
    return pid


def _supervisor(pid: int, open_sockets: list[socket.socket]) -> WatchedSubprocess:
    sup = object.__new__(WatchedSubprocess)  # just the state _check_subprocess_exit reads
    sup._process = PsutilTracker(psutil.Process(pid))
    sup._exit_code = None
    sup._process_exit_monotonic = None
    sup._open_sockets = weakref.WeakKeyDictionary({s: "stdout" for s in open_sockets})
    return sup


def test_without_the_patch_the_check_gives_up_at_once(monkeypatch):
    """The race itself: sockets all closed, process not yet reapable, the check returns None (and
    the supervisor's select() then sleeps with nothing to wake it)."""
    pid = _exiting_child(0.3)
    try:
        assert _supervisor(pid, [])._check_subprocess_exit() is None
    finally:
        os.waitpid(pid, 0)


def test_a_process_with_every_socket_closed_is_waited_for(patched, monkeypatch):
    monkeypatch.setattr(supervisor_exit, "EXIT_WAIT_S", 30.0)  # a loaded machine may run the child late
    pid = _exiting_child(0.3)
    started = time.monotonic()
    sup = _supervisor(pid, [])
    assert sup._check_subprocess_exit() == 0
    assert time.monotonic() - started > 0.25
    assert sup._process_exit_monotonic is not None


def test_a_process_with_a_socket_open_is_not_waited_for(patched):
    pid = _exiting_child(3.0)
    ours, theirs = socket.socketpair()
    try:
        started = time.monotonic()
        assert _supervisor(pid, [ours])._check_subprocess_exit() is None
        assert time.monotonic() - started < 2.0  # waited, it would return 0 after 3 s
    finally:
        ours.close(), theirs.close()
        os.waitpid(pid, 0)


def test_the_wait_is_bounded(patched, monkeypatch):
    monkeypatch.setattr(supervisor_exit, "EXIT_WAIT_S", 0.1)
    pid = _exiting_child(3.0)
    try:
        started = time.monotonic()
        assert _supervisor(pid, [])._check_subprocess_exit() is None
        assert time.monotonic() - started < 2.0
    finally:
        os.waitpid(pid, 0)
