"""Startup checks: fail in seconds with the reason, not hours later with a hung collective.

Every rank checks itself (devices, ``/dev/shm``, world size), then all ranks exchange their
results and versions with one ``all_gather_object``, so every rank sees every failure and all
of them stop together with the same message. Each check is a structured event.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import shutil
from typing import Any

import torch
import torch.distributed as dist

from trainer import StartupCheckFailed
from trainer.events import Events
from trainer.hooks import LoopHook
from trainer.parallel import Dist

MIN_SHM_NCCL = 512 << 20   # NCCL's shared-memory transport fails on Docker's 64 MiB default


def _devices(ctx: Dist) -> tuple[dict[str, Any], str | None]:
    if ctx.device.type != "cuda":
        return {"kind": "cpu", "cpus": os.cpu_count(), "threads": torch.get_num_threads()}, None
    count = torch.cuda.device_count()
    info = {"kind": "cuda", "count": count, "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "name": torch.cuda.get_device_name(ctx.device) if ctx.local_rank < count else None}
    if ctx.local_rank >= count:
        return info, f"LOCAL_RANK {ctx.local_rank} but only {count} CUDA device(s) visible"
    return info, None


def _shm(ctx: Dist) -> tuple[dict[str, Any], str | None]:
    try:
        total = shutil.disk_usage("/dev/shm").total
    except FileNotFoundError:
        return {"bytes": None}, "/dev/shm does not exist" if ctx.backend == "nccl" else None
    info = {"bytes": total, "mib": total >> 20}
    if ctx.backend == "nccl" and ctx.world > 1 and total < MIN_SHM_NCCL:
        return info, (f"/dev/shm is {total >> 20} MiB, NCCL needs at least {MIN_SHM_NCCL >> 20} MiB "
                      "(mount a larger emptyDir with medium: Memory, or docker --shm-size)")
    return info, None


def _versions(ctx: Dist, hooks: LoopHook) -> dict[str, Any]:
    nccl = None
    if ctx.backend == "nccl":
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    return {"torch": hooks.torch_version(ctx.rank, torch.__version__), "nccl": nccl,
            "cuda": torch.version.cuda, "python": platform.python_version()}


def run(ctx: Dist, expected_world: int | None, events: Events, hooks: LoopHook) -> None:
    """Raises ``StartupCheckFailed`` (on every rank) naming each failed check and rank."""
    devices, device_problem = _devices(ctx)
    shm, shm_problem = _shm(ctx)
    failures = [f"{name}: {problem}" for name, problem in (("devices", device_problem), ("dev_shm", shm_problem))
                if problem]
    if expected_world is not None and ctx.world != expected_world:
        failures.append(f"world_size: {ctx.world} processes joined, the config asks for {expected_world} "
                        "(compute.nodes x compute.procs_per_node)")
    mine = {"rank": ctx.rank, "host": platform.node(), "devices": devices, "shm": shm, "failures": failures,
            "versions": _versions(ctx, hooks)}
    for failure in failures:
        events.emit("check_failed", logging.ERROR, write=False, problem=failure)
    everyone: list[Any] = [mine]
    if ctx.world > 1:
        everyone = [None] * ctx.world
        dist.all_gather_object(everyone, mine)
    per_rank = {r["rank"]: r for r in everyone}
    problems = [f"rank {r['rank']} ({r['host']}): {f}" for r in everyone for f in r["failures"]]
    groups: dict[str, list[int]] = {}
    for r in everyone:
        groups.setdefault(json.dumps(r["versions"], sort_keys=True), []).append(r["rank"])
    if len(groups) > 1:
        problems.append("versions differ across ranks: "
                        + "; ".join(f"ranks {ranks} have {key}" for key, ranks in groups.items()))

    def emit(name: str, ok: bool, **fields: Any) -> None:
        events.emit(name, logging.INFO if ok else logging.ERROR, ok=ok, **fields)

    emit("check_devices_visible", not any("devices:" in f for f in problems),
         devices={r: v["devices"] for r, v in per_rank.items()})
    emit("check_dev_shm", not any("dev_shm:" in f for f in problems), shm={r: v["shm"] for r, v in per_rank.items()})
    emit("check_world_size", expected_world in (None, ctx.world), world_size=ctx.world, expected=expected_world)
    emit("check_versions", len(groups) == 1, versions={r: v["versions"] for r, v in per_rank.items()})
    emit("startup_checks", not problems, problems=problems, hosts={r: v["host"] for r, v in per_rank.items()})
    if problems:
        raise StartupCheckFailed("startup checks failed: " + " | ".join(problems))
