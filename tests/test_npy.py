"""format.npy: the image header, against numpy, and the one validation rule every reader applies."""

from __future__ import annotations

import io

import numpy as np
import pytest

from wds_tools.format.npy import NPY_HEADER_BYTES, describe, image_header, image_side, npy_header


@pytest.mark.parametrize("size", [1, 8, 224, 512, 4096])
def test_image_header_is_what_numpy_writes_and_128_bytes(size):
    buf = io.BytesIO()
    np.save(buf, np.zeros((size, size, 3), np.uint8))
    assert buf.getvalue()[:NPY_HEADER_BYTES] == image_header(size)
    assert len(image_header(size)) == NPY_HEADER_BYTES and image_side(image_header(size)) == size


@pytest.mark.parametrize("shape, dtype, fortran, message", [
    ((8, 8, 3), "<f4", False, r"dtype <f4, shape \[8, 8, 3\]; expected uint8"),
    ((8, 9, 3), "|u1", False, r"shape \[8, 9, 3\]"),
    ((8, 8, 4), "|u1", False, r"shape \[8, 8, 4\]"),
    ((8, 8), "|u1", False, r"shape \[8, 8\]"),
    ((8, 8, 3), "|u1", True, r"Fortran order"),
])
def test_other_arrays_are_refused_with_what_they_hold(shape, dtype, fortran, message):
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": dtype, "fortran_order": fortran, "shape": shape})
    with pytest.raises(ValueError, match=message):
        image_side(buf.getvalue())
    assert describe(buf.getvalue()).startswith(f"dtype {np.dtype(dtype).str}")


def test_version_2_and_garbage_are_refused():
    buf = io.BytesIO()
    np.lib.format.write_array_header_2_0(buf, {"descr": "|u1", "fortran_order": False, "shape": (8, 8, 3)})
    with pytest.raises(ValueError, match="NPY 2.0"):
        image_side(buf.getvalue())
    with pytest.raises(ValueError):
        image_side(b"\x93NUMPY\x01\x00")
    with pytest.raises(ValueError):
        image_side(b"not an npy header at all")
    assert describe(b"junk") == "no valid NPY header"
    assert npy_header((2, 2, 3)) is npy_header((2, 2, 3))  # cached
