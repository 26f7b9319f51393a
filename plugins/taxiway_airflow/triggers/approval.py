"""Waits beside an approval: fires ``due`` when it has waited ``registry.approval_reminder_s``, or
``answered`` as soon as it is no longer waiting (a person answered, or the timeout did), so the
reminder task never outlives the approval it watches.

The approval itself waits in ``awaiting_input`` with no trigger at all; this trigger only reads the
approval task's state through the Task SDK (as Airflow's own external-task trigger does), every
``poll_s`` seconds. Nothing it meets fails the run: a reminder is a courtesy, not a stage."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

# the approval's states before an answer; the Task SDK's execution API reports awaiting_input as "deferred"
WAITING = ("scheduled", "queued", "running", "awaiting_input", "deferred", "up_for_retry", None)


class ApprovalReminderTrigger(BaseTrigger):
    def __init__(self, dag_id: str, run_id: str, task_id: str, remind_at: str, poll_s: float) -> None:
        super().__init__()
        self.dag_id, self.run_id, self.task_id = dag_id, run_id, task_id
        self.remind_at, self.poll_s = remind_at, poll_s

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {"dag_id": self.dag_id, "run_id": self.run_id, "task_id": self.task_id,
                 "remind_at": self.remind_at, "poll_s": self.poll_s})

    async def _state(self) -> str | None:
        # the Task SDK's runtime, as Airflow's own external-task trigger imports it: only in the triggerer
        from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance
        from asgiref.sync import sync_to_async

        states = await sync_to_async(RuntimeTaskInstance.get_task_states)(
            dag_id=self.dag_id, task_ids=[self.task_id], run_ids=[self.run_id])
        return (states.get(self.run_id) or {}).get(self.task_id)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        due = datetime.fromisoformat(self.remind_at)
        while True:
            try:
                state = await self._state()
            except Exception as exc:  # the api-server away for a moment must not fail a run that waits for days
                self.log.warning("could not read the state of %s (%s); trying again in %.0f s",
                                 self.task_id, type(exc).__name__, self.poll_s)
                state = "awaiting_input"
            if state not in WAITING:
                yield TriggerEvent({"status": "answered", "state": state})
                return
            left = (due - datetime.now(UTC)).total_seconds()
            if left <= 0:
                yield TriggerEvent({"status": "due"})
                return
            await asyncio.sleep(min(self.poll_s, left))
