"""qcal.model.offload.fix_heap_thresholds: glibc's thresholds are set where the C library
is glibc, and nothing is attempted elsewhere."""

from __future__ import annotations

import platform

import pytest

from qcal.model.offload import fix_heap_thresholds

pytestmark = pytest.mark.unit


def test_thresholds_are_set_on_glibc_only() -> None:
    libc = fix_heap_thresholds()
    assert (libc is not None) is (platform.libc_ver()[0] == "glibc")


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc_trim")
def test_the_library_found_also_returns_freed_memory() -> None:
    libc = fix_heap_thresholds()
    assert libc is not None and libc.malloc_trim(0) in (0, 1)
