"""A pytest plugin for bench/test_tiers.py: each test's wall time and CPU (the test process and the
children it reaped), with its worker, start and outcome (a failure's last lines too), appended to
``$TAXIWAY_CPU_LOG`` as JSON lines."""

from __future__ import annotations

import json
import os
import resource
import time

import pytest


def _cpu() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


FAILURES = pytest.StashKey[list[str]]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = (yield).get_result()
    if report.failed:
        errors = [line for line in report.longreprtext.splitlines() if line.startswith("E ")]
        item.stash.setdefault(FAILURES, []).append(f"{report.when}: " + "\n".join(errors if len(errors) <= 15 else errors[:12] + errors[-3:]))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    cpu, wall, start = _cpu(), time.monotonic(), time.time()
    yield
    with open(os.environ["TAXIWAY_CPU_LOG"], "a") as fh:
        fh.write(json.dumps({"test": item.nodeid, "cpu_s": round(_cpu() - cpu, 2),
                             "wall_s": round(time.monotonic() - wall, 2), "start": start,
                             "worker": os.environ.get("PYTEST_XDIST_WORKER"),
                             "outcome": "failed" if FAILURES in item.stash else "passed",
                             **({"failures": item.stash[FAILURES]} if FAILURES in item.stash else {})}) + "\n")
