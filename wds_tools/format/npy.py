"""NPY: the header of every ``.npy`` member, built, parsed and validated in one place.

docs/FORMAT.md, "Members": NPY format 1.0, a 128-byte header for a C-order uint8 [S, S, 3]
array, then S·S·3 pixel bytes. Readers check a header with ``image_side``; the converter writes
``image_header``.
"""

from __future__ import annotations

import io
import re
from functools import lru_cache

import numpy as np

__all__ = [
    "NPY_HEADER_BYTES",
    "npy_header",
    "image_header",
    "read_npy_header",
    "image_side",
    "image_side_or_none",
    "describe",
    "describe_fields",
]

NPY_HEADER_BYTES = 128
"""The length of every ``.npy`` member's header (NPY format 1.0)."""


@lru_cache(maxsize=64)
def npy_header(shape: tuple[int, ...], dtype: str = "|u1") -> bytes:
    """The NPY 1.0 header (magic through padding) numpy writes for a C-order array."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": dtype, "fortran_order": False, "shape": tuple(shape)})
    return buf.getvalue()


def image_header(size: int) -> bytes:
    """The header of every ``.npy`` member of a ``size`` px conversion."""
    return npy_header((size, size, 3))


def read_npy_header(header: bytes) -> tuple[tuple[int, int], tuple[int, ...], bool, np.dtype, int]:
    """(version, shape, Fortran order, dtype, header length) of an NPY header; ValueError if it is none."""
    f = io.BytesIO(header)
    try:
        version = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read(f)
    except EOFError as e:
        raise ValueError(f"cut short: {e}") from None
    except ValueError:
        raise
    except Exception as e:  # numpy's parser lets SyntaxError, tokenize.TokenError, ... through
        raise ValueError(f"not an NPY header numpy can parse ({type(e).__name__}: {e})") from None
    return version, shape, fortran, dtype, f.tell()


# The shape in the header a conversion writes; the whole header is then compared with ours, so a
# match needs no parsing. numpy's parser (``ast.literal_eval``) is only used for other headers: it
# is slower, and CPython 3.11's ast keeps a recursion counter shared by all threads, which a fork
# taken while another thread is in it leaves wrong in the child ("AST constructor recursion depth
# mismatch"), so a reader's workers must not depend on it.
_OUR_SHAPE = re.compile(rb"'shape': \((\d{1,7}), \1, 3\)")


def image_side(header: bytes) -> int:
    """S of a wds-tools image header (NPY 1.0, 128 bytes, uint8 [S, S, 3] in C order); ValueError
    saying what differs for anything else."""
    head = bytes(header[:NPY_HEADER_BYTES])
    found = _OUR_SHAPE.search(head)
    if found is not None and len(head) == NPY_HEADER_BYTES:
        side = int(found.group(1))
        if side >= 1 and head == image_header(side):
            return side
    version, shape, fortran, dtype, length = read_npy_header(header)
    if dtype != np.uint8 or fortran or len(shape) != 3 or shape[2] != 3 or shape[0] != shape[1] or shape[0] < 1:
        raise ValueError(f"it holds {describe_fields(dtype, shape, fortran)}; expected uint8 [S, S, 3] in C order")
    if version != (1, 0) or length != NPY_HEADER_BYTES:
        raise ValueError(
            f"it is NPY {version[0]}.{version[1]} with a {length}-byte header; expected NPY 1.0 with "
            f"{NPY_HEADER_BYTES} bytes"
        )
    return int(shape[0])


def image_side_or_none(header: bytes) -> int | None:
    """S of a wds-tools image header, or None for any other header (``image_side`` without the reason)."""
    try:
        return image_side(header)
    except ValueError:
        return None


def describe_fields(dtype: np.dtype, shape: tuple[int, ...], fortran: bool) -> str:
    """dtype, shape and order of an NPY header, for messages."""
    return f"dtype {dtype.str}, shape {list(shape)}" + (", Fortran order" if fortran else "")


def describe(header: bytes) -> str:
    """What a header says, for messages."""
    try:
        _, shape, fortran, dtype, _ = read_npy_header(header)
    except ValueError:
        return "no valid NPY header"
    return describe_fields(dtype, shape, fortran)
