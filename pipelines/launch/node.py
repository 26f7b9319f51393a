"""One gang node: run ``torchrun`` as a child and record its exit code in a file.

Whoever watches the gang is usually not this process's parent (a retried Airflow task, a
trigger in the triggerer), so it cannot ``wait()`` for an exit status. The exit file gives it
one; a node with neither an exit file nor a live process was killed outright (SIGKILL, OOM).

    python -m pipelines.launch.node EXIT_FILE -- COMMAND...
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from trainer.fsio import utc_now, write_json_atomic


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m pipelines.launch.node EXIT_FILE -- COMMAND...", file=sys.stderr)
        return 2
    exit_file, cmd = Path(argv[0]), argv[2:]
    # Cancel signals the whole process group; torchrun handles them and forwards them to its
    # workers. This supervisor only has to outlive it to write the exit code.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    proc = subprocess.Popen(cmd, restore_signals=True,
                            preexec_fn=lambda: [signal.signal(s, signal.SIG_DFL)
                                                for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)])
    code = proc.wait()
    write_json_atomic(exit_file, {"code": code, "finished_at": utc_now()})
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
