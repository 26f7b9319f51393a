"""Share a list of jobs with forked child processes; the caller works on them too.

For short CPU-bound jobs (batches of MinHash signatures) a process pool costs more than it saves
on a small corpus: its feeder and manager threads compete with the workers for the cores, and
its workers start only after the caller has listed the jobs. Here the caller forks
``workers - 1`` children; every process claims the next job from a shared counter (so a caller
busy with other work, such as indexing the results, simply claims fewer), children send their
results through a pipe, and the caller yields its own and the children's results as they come.
A child's exception is re-raised in the caller; a child that dies is an error naming the
signal or exit status; children are killed and reaped whatever happens.

Fork, so the children need no imports and see the caller's data (local and in-memory
filesystems alike); POSIX only.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import Any, Generic, TypeVar

from pipelines.errors import Transient

T = TypeVar("T")
R = TypeVar("R")
_DONE = "done"


class _Failed:
    """A child's exception, carried to the caller (its repr when it does not pickle)."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class _Counter:
    """The next unclaimed job, in shared memory, so every process takes one at a time."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.value = multiprocessing.get_context("fork").Value("q", 0)

    def claim(self) -> int | None:
        lock = self.value.get_lock()
        if not lock.acquire(timeout=60):  # held for microseconds; a process killed inside holds it forever
            raise Transient("a worker process died holding the shared job counter")
        try:
            i = self.value.value
            if i >= self.total:
                return None
            self.value.value = i + 1
            return i
        finally:
            lock.release()


def split_map(fn: Callable[[T], R], items: list[T], workers: int,
              before: Callable[[], Any] | None = None) -> Iterator[tuple[int, R]]:
    """``(i, fn(items[i]))`` for every item, in completion order, on ``workers`` processes.
    ``before``: a head start on the caller's own later work (imports), done once the children
    have started on the jobs, in place of jobs the caller would have claimed; skipped when there
    are no children (there is nothing to overlap it with)."""
    workers = min(workers, len(items))
    if workers <= 1:
        yield from enumerate(map(fn, items))
        return
    jobs = _Counter(len(items))
    children: dict[int, Connection] = {}
    try:
        for _ in range(workers - 1):
            recv, send = multiprocessing.Pipe(duplex=False)
            pid = os.fork()
            if pid == 0:
                recv.close()
                _child(fn, items, jobs, send)
            send.close()
            children[pid] = recv
        if before is not None:
            before()
        while (i := jobs.claim()) is not None:
            yield i, fn(items[i])
            yield from _collect(children, block=False)
        yield from _collect(children, block=True)
    finally:
        for pid, conn in children.items():
            conn.close()
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)


def _child(fn: Callable[[T], Any], items: list[T], jobs: _Counter, conn: Connection) -> None:
    """Claim, compute and send ``(i, result)`` until no job is left, then ``_DONE``; never returns."""
    code = 0
    try:
        while (i := jobs.claim()) is not None:
            conn.send((i, fn(items[i])))
        conn.send(_DONE)
    except BaseException as exc:  # noqa: BLE001 — everything goes back to the caller
        code = 1
        _send_failure(conn, exc)
    finally:
        os._exit(code)


def _send_failure(conn: Connection, exc: BaseException) -> None:
    """``exc`` to the caller, or its repr when it does not pickle."""
    try:
        conn.send(_Failed(exc))
    except Exception:  # noqa: BLE001 — an exception that does not pickle
        conn.send(_Failed(RuntimeError(repr(exc))))


def _collect(children: dict[int, Connection], block: bool) -> Iterator[tuple[int, Any]]:
    """Results the children have sent; with ``block``, all of them until every child is done
    (finished children leave ``children``)."""
    for pid, conn in list(children.items()):
        while block or conn.poll():
            try:
                msg = conn.recv()
            except EOFError:
                _, status = os.waitpid(pid, 0)
                del children[pid]
                raise Transient(f"worker process {pid} died without a result ({_describe(status)})") from None
            if isinstance(msg, _Failed):
                raise msg.exc
            if isinstance(msg, str):  # _DONE
                conn.close()
                os.waitpid(pid, 0)
                del children[pid]
                break
            yield msg


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit status {os.waitstatus_to_exitcode(status)}"


class Ahead(Generic[R]):
    """One job whose warm-up (imports, first-use setup) starts now, in a forked child, while the
    caller does other work; the job's input is sent later, its result comes back. With ``enabled``
    False (one worker) nothing is forked and there is nothing to warm up ahead of: ``result`` runs
    the job in the caller.

    A child's exception is re-raised by ``result``; the child is killed and reaped by ``close``.
    """

    def __init__(self, warm_up: Callable[[], Any], job: Callable[[Any], R], enabled: bool) -> None:
        self.warm_up, self.job, self.pid = warm_up, job, None
        self.arg: Any = None
        if enabled:
            self.conn, child = multiprocessing.Pipe(duplex=True)
            self.pid = os.fork()
            if self.pid == 0:
                self.conn.close()
                self._child(child)
            child.close()

    def _child(self, conn: Connection) -> None:
        code = 0
        try:
            self.warm_up()
            conn.send(self.job(conn.recv()))
        except EOFError:  # the caller went away without sending the input
            pass
        except BaseException as exc:  # noqa: BLE001 — everything goes back to the caller
            code = 1
            _send_failure(conn, exc)
        finally:
            os._exit(code)

    def submit(self, arg: Any) -> None:
        if self.pid is None:
            self.arg = arg
            return
        try:
            self.conn.send(arg)
        except (BrokenPipeError, ConnectionResetError):  # the child died: ``result`` says how
            pass

    def result(self) -> R:
        if self.pid is None:
            return self.job(self.arg)
        try:
            msg = self.conn.recv()
        except (EOFError, ConnectionResetError):
            _, status = os.waitpid(self.pid, 0)
            self.pid = None
            raise Transient(f"worker process died without a result ({_describe(status)})") from None
        if isinstance(msg, _Failed):
            raise msg.exc
        return msg

    def close(self) -> None:
        if self.pid is not None:
            self.conn.close()
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(self.pid, 0)
            self.pid = None

    def __enter__(self) -> Ahead[R]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
