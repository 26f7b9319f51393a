"""glibc's allocator tuned for batch-at-a-time numpy work: freed memory is kept for reuse.

By default glibc serves a block over 128 KiB (at first; the threshold then adapts) with its own
``mmap`` and returns freed heap tops to the kernel, so every temporary array of a batch lands on
fresh pages, which the kernel faults in and zeroes page by page. The MinHash kernel makes a dozen
such temporaries per 256 KiB batch; on the x1 corpus a third of the overlap check's time was those
page faults (bench/results/history.md, "Overlap at x1"). With blocks up to 32 MiB (glibc's ceiling for
the setting) taken from the heap and the heap never trimmed on free, the next batch reuses the
pages the last one touched. The peak resident size is unchanged (what is kept was in use at the
peak); a process keeps it until it exits, which data-stage task processes soon do.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import cache

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3   # mallopt parameters (malloc.h)
_MMAP_THRESHOLD = 32 << 20                       # HEAP_MAX_SIZE / 2 on 64-bit: the largest glibc accepts
_TRIM_THRESHOLD = 2**31 - 1                      # mallopt takes an int: 2 GiB, in effect never


@cache
def retain_freed_memory() -> bool:
    """Tune it once per process (forked children inherit it); False where the C library is not
    glibc or refuses (its allocator is left as it is)."""
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c")).mallopt
    except (OSError, AttributeError, TypeError):  # no mallopt: not glibc (musl, macOS)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD) and mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD))
