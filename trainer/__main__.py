"""``python -m trainer --spec SPEC.json`` — run under torchrun, one process per rank."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

from trainer.loop import train
from trainer.spec import TrainSpec


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
    args = parser.parse_args(argv)
    _logging()
    return train(TrainSpec.load(args.spec))


if __name__ == "__main__":
    sys.exit(main())
