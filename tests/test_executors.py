"""taxiway_airflow.executors.LocalExecutor against Airflow's real executor: its worker processes, which
fork every task process, are forked with Taxiway's task imports already loaded."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import REPO

# In a fresh interpreter: the test process has imported pandas long ago. The worker's memory map shows
# what it inherited: pandas' and tokenizers' compiled extensions, mapped before the fork.
PROBE = """
import json, sys
for blocked in sys.argv[1:]:
    sys.modules[blocked] = None  # its import raises ImportError
from taxiway_airflow.executors import LocalExecutor
from airflow.sdk.execution_time.supervisor import WatchedSubprocess
before = [m for m in ("pandas", "great_expectations", "tokenizers") if m in sys.modules]
executor = LocalExecutor(parallelism=1)
executor.start()
try:
    (worker,) = executor.workers.values()
    maps = open(f"/proc/{worker.pid}/maps").read()
    print("PROBE", json.dumps({"before": before, "worker_alive": worker.is_alive(),
                      "worker_maps": [lib for lib in ("pandas/_libs", "tokenizers") if lib in maps],
                      "great_expectations": "great_expectations" in sys.modules,
                      "exit_wait": getattr(WatchedSubprocess._check_subprocess_exit, "taxiway_exit_wait", False)}))
finally:
    executor.end()
"""


def _probe(*blocked: str) -> tuple[dict, str]:
    out = subprocess.run([sys.executable, "-c", PROBE, *blocked], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    (line,) = (ln for ln in out.stdout.splitlines() if ln.startswith("PROBE "))  # the rest is Airflow's log
    return json.loads(line.removeprefix("PROBE ")), out.stdout + out.stderr


def test_the_local_executor_forks_its_workers_with_the_task_imports_loaded():
    seen, _ = _probe()
    assert seen == {"before": [], "worker_alive": True, "worker_maps": ["pandas/_libs", "tokenizers"],
                    "great_expectations": True, "exit_wait": True}, seen


def test_a_preload_that_fails_is_logged_and_the_executor_starts_without_it():
    """The preload is a saving: a scheduler whose preload fails (here: tiktoken will not import) still
    starts its workers, with the supervisor's exit wait, and says what failed."""
    seen, log = _probe("tiktoken")
    assert seen["worker_alive"] and seen["exit_wait"] and not seen["great_expectations"], seen
    assert "preloading Taxiway's task imports failed" in log and "preloaded nothing" in log, log[-3000:]
