"""Processes that race for a lock or an alias: a file barrier that lets them enter together, and
waiting for all of them without leaving one behind."""

from __future__ import annotations

import subprocess
import textwrap

BARRIER = textwrap.dedent("""
    import pathlib, time
    def barrier(folder, rnd, me, n):
        # every contender touches its file, then waits for all: they enter the critical section together
        folder = pathlib.Path(folder)
        (folder / f"{rnd}-{me}").touch()
        deadline = time.monotonic() + 300  # bounds a hang only
        while len(list(folder.glob(f"{rnd}-*"))) < n:
            assert time.monotonic() < deadline, f"round {rnd}: the other contenders never arrived"
            time.sleep(0.002)
""")


def all_succeed(procs: list[subprocess.Popen], timeout_s: float = 600) -> None:
    """Every contender exits 0; whatever fails, none is left waiting at the barrier for the next test."""
    try:
        for p in procs:
            assert p.wait(timeout=timeout_s) == 0, p.stderr.read()[-3000:]
    finally:
        for p in procs:
            p.kill()
            p.wait()
