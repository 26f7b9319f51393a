"""At most once: an alert about a thing that stays true (a batch still quarantined, a champion still
stale) would go out on every refresh's plan. ``claim`` records the thing the first time, under
``$TAXIWAY_HOME/alerts/sent/``, one file per key, made with O_EXCL so two claims never both win."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from pipelines.run_folder import taxiway_home


def sent_dir() -> Path:
    return taxiway_home() / "alerts" / "sent"


def claim(key: str) -> bool:
    """True the first time ``key`` is claimed in this ``TAXIWAY_HOME``, False every time after."""
    folder = sent_dir()
    folder.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(folder / hashlib.sha256(key.encode()).hexdigest(), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")  # for a person looking: which alert this was
    return True
