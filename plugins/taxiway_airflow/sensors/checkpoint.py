"""Evaluation starts only once the final checkpoint is complete, valid and exported."""

from __future__ import annotations

import logging
from typing import Any

from airflow.sdk import BaseSensorOperator
from airflow.sdk.configuration import conf

from pipelines.stages import train as train_stage
from taxiway_airflow.failures import failure_kinds
from taxiway_airflow.tasks.common import run_dir_of

log = logging.getLogger("taxiway")


POKE_INTERVAL_S = 5.0  # the deployment may set it: [taxiway] checkpoint_poke_s (AIRFLOW__TAXIWAY__CHECKPOINT_POKE_S)


class CheckpointSensor(BaseSensorOperator):
    """Pokes ``train_stage.final_checkpoint_ready`` (rescheduled between pokes: holds no worker slot)."""

    template_fields = ("run",)

    def __init__(self, *, run: Any, **kwargs: Any) -> None:
        kwargs.setdefault("poke_interval", conf.getfloat("taxiway", "checkpoint_poke_s", fallback=POKE_INTERVAL_S))
        kwargs.setdefault("timeout", 600)
        kwargs.setdefault("mode", "reschedule")
        super().__init__(**kwargs)
        self.run = run

    def poke(self, context: Any) -> bool:
        with failure_kinds():
            ready, reason = train_stage.final_checkpoint_ready(run_dir_of(self.run))
        log.info("%s", reason)
        return ready
