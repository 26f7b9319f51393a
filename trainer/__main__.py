"""``python -m trainer --spec SPEC.json [--smoke]`` — run under torchrun, one process per rank.

``--smoke`` runs in seconds on one process before any gang is scheduled: 2 steps with a
checkpoint each, then a resume to step 3, in the folder its spec names (the launcher writes a
smoke spec apart from the real run's); it fails when the loss is not finite or the resume did not happen.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import sys
import time

from trainer.loop import train
from trainer.spec import TrainSpec
from trainer.status import State


def _logging() -> None:
    rank = os.environ.get("RANK", "0")
    logging.Formatter.converter = time.gmtime
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr,
        format=f"%(asctime)s.%(msecs)03dZ rank{rank} %(levelname)s %(name)s: %(message)s",
        datefmt="%Y-%m-%dT%H:%M:%S")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer", description=__doc__)
    parser.add_argument("--spec", required=True, help="train spec JSON written by the launcher")
    parser.add_argument("--smoke", action="store_true", help="a few steps, save, resume, check the loss")
    args = parser.parse_args(argv)
    _logging()
    spec = TrainSpec.load(args.spec)
    return smoke(spec) if args.smoke else train(spec)


def smoke(spec: TrainSpec) -> int:
    """Needs a spec whose paths name an empty folder (the launcher clears it)."""
    base = dataclasses.replace(spec.train, warmup_steps=1, log_every=1)
    ckpt = dataclasses.replace(spec.checkpoint, every_steps=1, keep_last_n=2)
    for steps in (2, 3):  # the second call must resume from the first call's step-2 checkpoint
        code = train(dataclasses.replace(spec, train=dataclasses.replace(base, steps=steps), checkpoint=ckpt,
                                         world_size=1))
        if code != 0:
            return code
    status = json.loads(spec.paths.status.read_text())
    # steps count from the parent's global step when there is one: 3 steps after it, not step 3
    ok = (status["state"] == State.SUCCEEDED and status["step"] == status["total_steps"] and status["restarts"] == 1
          and status["loss"] is not None and math.isfinite(status["loss"]))
    print(json.dumps({"smoke": "passed" if ok else "failed", **status}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
