"""format.packed: the string columns of samples.npz (source paths, metadata categories)."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from wds_tools.format.packed import pack_strings, unpack_strings


def test_the_stored_bytes():
    offsets, data = pack_strings(["a", "ü", ""])
    assert offsets.dtype == np.dtype("<u8") and offsets.tolist() == [0, 1, 3, 3]
    assert data.dtype == np.dtype("u1") and data.tobytes() == "aü".encode()


@given(st.lists(st.text()))
def test_round_trip_and_rows(values):
    offsets, data = pack_strings(values)
    assert unpack_strings(offsets, data) == values
    for i in range(len(values)):
        assert unpack_strings(offsets[i : i + 2], data) == [values[i]]


def test_replace_keeps_a_damaged_string_readable():
    offsets, data = np.array([0, 2], dtype="<u8"), np.frombuffer(b"a\xff", dtype="u1")
    assert unpack_strings(offsets, data, errors="replace") == ["a\ufffd"]
