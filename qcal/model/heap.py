"""The C heap's behaviour under layer-by-layer work (glibc only).

glibc serves big allocations with mmap and returns them to the system when freed, but by
default it raises that size threshold each time such a block is freed (up to 32 MB), so
later tensors of a few to a few tens of MB land on the ordinary heap. Loading or quantizing
one module at a time frees many of those between the tensors it keeps, and the heap keeps
the holes: an 8B checkpoint held 4.98 GiB of tensors in 7.1 GiB of memory. A fixed
threshold keeps every big tensor in its own mapping, so freeing it gives the memory back.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

M_MMAP_THRESHOLD = -3  # mallopt's parameter number, from glibc's malloc.h
MMAP_THRESHOLD_BYTES = 4 << 20
_log = logging.getLogger(__name__)


def fix_mmap_threshold(threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Set glibc's mmap threshold to `threshold` bytes (which also stops its adjustment).
    Returns whether it was set; other C libraries are left as they are."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    done = bool(mallopt(M_MMAP_THRESHOLD, threshold))
    _log.debug("glibc mmap threshold %s to %d bytes", "set" if done else "not set", threshold)
    return done
