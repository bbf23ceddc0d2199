"""A sample in a shard: its members, their order, and its ``.json`` (docs/FORMAT.md, "Shards").

Versions 2 and 3 write ``<key>.cls``, ``<key>.i32``, ``<key>.json``, ``<key>.npy``, in that order; version 1
(read) has ``cls``, ``json``, ``npy``. Why ``.i32`` rather than ``.cls.i32`` (keys of 95 characters fit
ustar's name field), and the keys every ``.json`` holds: docs/FORMAT.md, "Shards" and "Keys".
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Mapping, Sequence

__all__ = [
    "MEMBERS",
    "MEMBERS_V1",
    "column_prefix",
    "label_i32",
    "read_label_i32",
    "classes_digest",
    "sample_json",
    "identity_prefix",
    "JSON_FIELDS",
    "DIGEST_HEX",
]

MEMBERS_V1 = ("cls", "json", "npy")
"""A sample's tar members in format version 1."""
MEMBERS = ("cls", "i32", "json", "npy")
"""A sample's tar members as the converter writes them (format version 2 on)."""
DIGEST_HEX = 16
"""``classes_digest``'s length: the first 16 lowercase hex digits (64 bits) of a SHA-256."""
JSON_FIELDS = (
    "classes_digest",
    "dataset_version",
    "fingerprint",
    "height",
    "key",
    "label",
    "original_key",
    "source_path",
    "width",
)
"""The ``.json`` fields of every version-2 sample (``meta`` too when the conversion has metadata columns)."""


def column_prefix(ext: str) -> str:
    """samples.npz's column prefix of a member (``i32`` -> ``i32_offset``, ``i32_length``): the
    extension with any dot as ``_``."""
    return ext.replace(".", "_")


def label_i32(label: int) -> bytes:
    """The ``.i32`` member: the class index as a little-endian int32."""
    return struct.pack("<i", label)


def read_label_i32(data: bytes | memoryview) -> int | None:
    """The class index an ``.i32`` member holds; None when it is not 4 bytes."""
    return struct.unpack("<i", data)[0] if len(data) == 4 else None


def classes_digest(classes: Sequence[str]) -> str:
    """The first 16 hex digits of SHA-256 of the class list as canonical JSON, UTF-8:
    ``json.dumps(classes, ensure_ascii=False, separators=(",", ":"))`` (``["cat","dog"]``)."""
    text = json.dumps(list(classes), ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:DIGEST_HEX]


def sample_json(fields: Mapping) -> bytes:
    """A ``.json`` member's bytes: sorted keys, no whitespace, non-ASCII as itself, UTF-8."""
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def identity_prefix(dataset_version: str, digest: str) -> bytes:
    """How every ``.json`` the converter writes for this dataset begins: ``classes_digest`` and
    ``dataset_version`` are the first two of its sorted keys (``sample_json``). A reader may take a
    sample that begins so as one of this dataset without parsing it, and parse any other."""
    return sample_json({"classes_digest": digest, "dataset_version": dataset_version})[:-1] + b","
