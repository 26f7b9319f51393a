"""One allocator policy per process (``pipelines/heap.py``): set by whoever starts the process (the
``taxiway`` CLI's main, a Taxiway task as its process starts), once, and never by a stage."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from conftest import REPO

# every mallopt call the process makes through ctypes, whoever makes it, is recorded in CALLS
_COUNTING = """
import ctypes, json, sys
CALLS = []
class CDLL(ctypes.CDLL):
    def __getattr__(self, name):
        fn = super().__getattr__(name)
        if name != "mallopt":
            return fn
        def counted(*args):
            CALLS.append(list(args))
            return fn(*args)
        setattr(self, name, counted)
        return counted
ctypes.CDLL = CDLL
"""


def _calls(code: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "plugins")])}
    out = subprocess.run([sys.executable, "-c", _COUNTING + code], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_starter_sets_the_policy_once_and_no_stage_changes_it():
    from pipelines.heap import POLICY

    policy = [[param, value] for param, value in POLICY.items()]
    task = _calls("""
from taxiway_airflow.failures import translated
from pipelines.preflight.minhash import batch_shingles
imported = list(CALLS)
translated(lambda: None)(); translated(lambda: None)()   # two tasks' callables in one process
started = list(CALLS)
batch_shingles([b"one two three four five six seven"], 5)  # the overlap check's kernel
print(json.dumps({"imported": imported, "started": started, "after_stage": CALLS}))
""")
    assert task == {"imported": [], "started": policy, "after_stage": policy}
    cli = _calls("""
sys.argv = ["taxiway", "--help"]
from pipelines.cli import main
try:
    main()
except SystemExit:
    pass
print(json.dumps({"started": CALLS}))
""")
    assert cli == {"started": policy}


def test_only_the_policy_module_calls_mallopt_and_only_process_starters_set_it():
    """The tokenizer's packing needs a corpus to run: its part is checked in the source, as every module's."""
    calls, setters = [], []
    for folder in ("pipelines", "plugins", "trainer", "eval"):
        for path in sorted((REPO / folder).rglob("*.py")):
            text, where = path.read_text(), str(path.relative_to(REPO))
            calls += [where] if "mallopt" in text and where != "pipelines/heap.py" else []
            setters += [where] if re.search(r"\bset_policy\(\)", text) and where != "pipelines/heap.py" else []
    assert calls == [], f"mallopt called outside pipelines/heap.py: {calls}"
    assert sorted(setters) == ["pipelines/cli.py", "plugins/taxiway_airflow/failures.py"], setters
