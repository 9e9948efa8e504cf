"""qcal.model.heap: the fixed mmap threshold is set where the C library is glibc."""

from __future__ import annotations

import platform

import pytest

from qcal.model.heap import fix_mmap_threshold

pytestmark = pytest.mark.unit


def test_the_threshold_is_set_on_glibc_and_left_alone_elsewhere() -> None:
    applied = fix_mmap_threshold()
    assert applied is (platform.libc_ver()[0] == "glibc")
