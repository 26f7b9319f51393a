"""Keep glibc's allocator from turning tokenizer churn into resident memory.

The Rust tokenizer encodes each batch on its own thread pool; every thread gets a glibc malloc
arena, and freed batch buffers stay mapped in those arenas, so resident memory creeps up with the
number of batches (``bench/tokenize_bench.py`` measures peak RSS on the 1x and the 10x corpus).
Capping the arenas and returning freed memory above 1 MiB to the kernel keeps the peak set by one
batch, not by the corpus. glibc only; elsewhere this is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8
_ONE_MIB = 1 << 20


@functools.cache
def _libc():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


@functools.cache
def bound() -> bool:
    """Cap arenas and trim thresholds once per process (before the tokenizer's threads start)."""
    libc = _libc()
    if libc is None:
        return False
    libc.mallopt(_M_ARENA_MAX, 2)
    libc.mallopt(_M_TRIM_THRESHOLD, _ONE_MIB)
    libc.mallopt(_M_MMAP_THRESHOLD, _ONE_MIB)
    return True


def trim() -> None:
    """Hand memory freed by the last group back to the kernel."""
    if (libc := _libc()) is not None:
        libc.malloc_trim(0)
