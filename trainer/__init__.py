"""The program that runs inside each training pod (or local gang node).

Imports torch, numpy, safetensors and the standard library only: the image stays small and a
pod needs no tracking credentials. Rank 0 writes ``status.json``, ``metrics.jsonl`` and
``events.jsonl``; the orchestrator ships them onward. docs/trainer.md describes the checkpoint
format, the resume rules and the health events.

Exit codes of ``python -m trainer`` (one rank; ``status.json`` carries the reason as ``error``):
"""

EXIT_OK = 0
EXIT_FAILED = 1          # an unexpected error (traceback in the log, ``error`` in status.json)
EXIT_STARTUP = 3         # a startup check failed: devices, /dev/shm, world size, versions across ranks
EXIT_NONFINITE = 4       # NaN/Inf loss or gradient in ``train.max_nonfinite_steps`` consecutive steps
EXIT_DATA_STALL = 5      # data-loader watchdog: no batch within ``train.data_timeout_s`` (stacks dumped)
EXIT_DISK_FULL = 6       # no room for the next checkpoint; the newest valid one stands, nothing torn is left
EXIT_CANCELED = 143      # SIGTERM honoured: step finished, checkpoint saved, state ``canceled``


class TrainerError(RuntimeError):
    """A failure with a known cause: the trainer reports it in status.json and exits with ``code``."""

    code = EXIT_FAILED


class StartupCheckFailed(TrainerError):
    code = EXIT_STARTUP


class NonFiniteLoss(TrainerError):
    code = EXIT_NONFINITE


class DiskFull(TrainerError):
    code = EXIT_DISK_FULL
