"""Trigger that watches a training gang from the triggerer, so waiting holds no worker slot.

It fires when the gang ends (succeeded, failed, stalled, timed out) or every ``report_every_s``
so the operator can ship new metrics to MLflow and log progress before deferring again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent


class GangTrigger(BaseTrigger):
    def __init__(self, watch: dict[str, Any], poll_s: float, report_every_s: float, cancel_grace_s: float) -> None:
        super().__init__()
        self.watch = watch
        self.poll_s = poll_s
        self.report_every_s = report_every_s
        self.cancel_grace_s = cancel_grace_s

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {"watch": self.watch, "poll_s": self.poll_s, "report_every_s": self.report_every_s,
                 "cancel_grace_s": self.cancel_grace_s})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from pipelines.launch import local
        from pipelines.launch.watch import Watch

        watch = Watch(**self.watch)
        started = time.monotonic()
        while True:
            result = await asyncio.to_thread(watch.check)
            if result["state"] != local.RUNNING or time.monotonic() - started >= self.report_every_s:
                yield TriggerEvent(result)
                return
            await asyncio.sleep(self.poll_s)

    async def on_kill(self) -> None:
        """The user failed or cleared the waiting task: SIGTERM → checkpoint → ``canceled``, then nothing left."""
        from pathlib import Path

        from pipelines.launch import local

        handle = local.Handle.load(Path(self.watch["gang_json"]))
        await asyncio.to_thread(local.cleanup, handle, self.cancel_grace_s)
