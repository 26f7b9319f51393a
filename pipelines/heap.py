"""glibc's allocator policy: one per process, set by whoever starts the process, never by a stage.

``set_policy()`` is called by ``taxiway``'s ``main`` and as each Taxiway task starts
(``taxiway_airflow.failures.translated``); forked pool workers inherit it. (The MinHash kernel and the
tokenizer used to set opposite values, so in ``taxiway run`` whichever stage ran first decided.)

Why these values: blocks up to 32 MiB from a never-trimmed heap let the MinHash batches reuse pages
instead of faulting in fresh ones (overlap x1 -19%); at most two arenas plus ``trim()`` after each
tokenized group keep the tokenizer's threads from hoarding freed buffers (peak RSS x10/x1 1.10, its
own former setting 1.07, target <= 1.2; bench/results/allocator_policy.txt).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import cache
from typing import Any

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8   # mallopt parameters (malloc.h)
POLICY = {
    _M_MMAP_THRESHOLD: 32 << 20,    # HEAP_MAX_SIZE / 2 on 64-bit: the largest glibc accepts
    _M_TRIM_THRESHOLD: 2**31 - 1,   # mallopt takes an int: 2 GiB, in effect never (trim() hands memory back)
    _M_ARENA_MAX: 2,
}


@cache
def _libc() -> Any:
    """glibc, or None where the C library has no mallopt/malloc_trim (musl, macOS)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    if not (hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim")):
        return None
    libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return libc


@cache
def set_policy() -> bool:
    """Set the policy, once per process (later calls do nothing); False where the C library is not
    glibc or refuses a setting (what it did accept stays)."""
    libc = _libc()
    return libc is not None and all([libc.mallopt(param, value) for param, value in POLICY.items()])


def trim() -> None:
    """Hand freed memory back to the kernel now (the tokenizer, after each file group)."""
    if (libc := _libc()) is not None:
        libc.malloc_trim(0)
