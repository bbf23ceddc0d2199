"""format.npy: the image header, against numpy, and the one validation rule every reader applies."""

from __future__ import annotations

import io

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wds_tools.format.npy import NPY_HEADER_BYTES, describe, image_header, image_side, image_side_or_none, npy_header


@pytest.mark.parametrize("size", [1, 8, 224, 512, 4096])
def test_image_header_is_what_numpy_writes_and_128_bytes(size):
    buf = io.BytesIO()
    np.save(buf, np.zeros((size, size, 3), np.uint8))
    assert buf.getvalue()[:NPY_HEADER_BYTES] == image_header(size)
    assert len(image_header(size)) == NPY_HEADER_BYTES and image_side(image_header(size)) == size


@pytest.mark.parametrize(
    "shape, dtype, fortran, message",
    [
        ((8, 8, 3), "<f4", False, r"dtype <f4, shape \[8, 8, 3\]; expected uint8"),
        ((8, 9, 3), "|u1", False, r"shape \[8, 9, 3\]"),
        ((8, 8, 4), "|u1", False, r"shape \[8, 8, 4\]"),
        ((8, 8), "|u1", False, r"shape \[8, 8\]"),
        ((8, 8, 3), "|u1", True, r"Fortran order"),
    ],
)
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


def _side_by_numpy(header: bytes) -> int | str:
    """The slow reference: numpy's own parser (ast.literal_eval of the dict), then the rule."""
    f = io.BytesIO(header)
    try:
        version = np.lib.format.read_magic(f)
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(f) if version == (1, 0) else ((), True, None)
    except Exception:
        return "refused"
    ok = (
        version == (1, 0)
        and f.tell() == NPY_HEADER_BYTES
        and dtype == np.uint8
        and not fortran
        and len(shape) == 3
        and shape[0] == shape[1] >= 1
        and shape[2] == 3
    )
    return int(shape[0]) if ok else "refused"


def _side(header: bytes) -> int | str:
    try:
        return image_side(header)
    except ValueError:
        return "refused"


@settings(max_examples=400, deadline=None)
@given(
    side=st.integers(1, 99999),
    flips=st.lists(st.tuples(st.integers(0, NPY_HEADER_BYTES - 1), st.integers(0, 255)), max_size=3),
    cut=st.integers(0, NPY_HEADER_BYTES + 8),
    tail=st.binary(max_size=8),
)
def test_image_side_equals_numpys_parse_on_any_damage(side, flips, cut, tail):
    """The fast path (a header byte-equal to ours needs no parse) and numpy's parser agree on every
    header: ours, ours with bytes changed, cut short, or followed by other bytes."""
    header = bytearray(image_header(side))
    for pos, value in flips:
        header[pos] = value
    header = bytes(header[:cut]) + tail
    assert _side(header) == _side_by_numpy(header)


def test_our_headers_are_read_without_numpys_parser(monkeypatch):
    """CPython 3.11's ast keeps one recursion counter for all threads: a loader's workers must not
    depend on ast.literal_eval for the headers a conversion writes."""
    import ast

    def refuse(*a, **k):
        raise AssertionError("ast.literal_eval called")

    monkeypatch.setattr(ast, "literal_eval", refuse)
    for size in (1, 16, 224, 384, 4096):
        assert image_side(image_header(size)) == size
        assert image_side(image_header(size) + b"\0" * 64) == size


def test_image_side_or_none_is_image_side_without_the_reason():
    """The one check stats and verify apply to a header they only need to accept or refuse."""
    assert image_side_or_none(image_header(224)) == 224
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False, "shape": (4, 4, 3)})
    assert image_side_or_none(buf.getvalue()) is None
    assert image_side_or_none(b"not an npy header at all") is None
    assert image_side_or_none(b"") is None
