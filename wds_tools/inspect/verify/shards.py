"""One shard against its rows of samples.npz: the bytes are the ground truth.

Full mode reads the shard once in 1 MiB chunks and hashes, walks and sums each (``format.tar.scan_file``);
quick mode walks the headers with small positioned reads. Both compare every member and sample with its row
(docs/guide/inspect.md, "How verify works").
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import xxhash

from ...format.meta import MetaColumn, npz_names
from ...format.model import Partial
from ...format.npy import NPY_HEADER_BYTES, image_header, image_side_or_none
from ...format.npy import describe as describe_npy
from ...format.sample import JSON_FIELDS, MEMBERS, column_prefix, read_label_i32
from ...format.tar import BLOCK, Member, TarWalker, scan_file, split_name, walk_headers
from ...storage.transport import file_size, read_ranges
from .problems import Problem, capped
from .rehash import phash_problems, phashes_of
from .table import SampleColumns, TableFacts, block_names, row_columns

__all__ = ["ShardJob", "Context", "ShardResult", "PixelSums", "reference_header", "check_shard"]

CLS_CAP, JSON_CAP = 64, 1 << 20  # bytes of a .cls (or .i32) / .json member kept; a longer one is damage
ROW_EXTRA = ("npy_xxh3", "fingerprint", "width", "height", "phash")


@dataclass
class ShardJob:
    """One shard to check, and where its rows are in samples.npz."""

    url: str
    name: str
    pos: int
    bytes: int | None
    sha256: str | None
    rows: tuple[int, int] | None


@dataclass
class Context:
    """What every shard job shares (read-only)."""

    table: SampleColumns | None
    usable: set[str]
    paths_ok: bool
    header: bytes | None  # the .npy header every member should have (None: any image header)
    classes: tuple[str, ...] | None
    quick: bool
    stats: bool = True  # full mode: sum the pixels for mean/std
    metadata: tuple[MetaColumn, ...] | None = None  # index.json's (None: unusable, not compared)
    categories: dict[int, list[str]] = field(default_factory=dict)  # string values of the metadata columns
    members: tuple[str, ...] = MEMBERS  # a sample's member extensions in file order (by format version)
    dataset: dict[str, str] | None = None  # the .json's dataset_version and classes_digest (version 2)
    phash: bool = False  # full mode: recompute each sample's perceptual hashes (verify --phash)

    def __post_init__(self) -> None:
        # each class index as its .cls member holds it (only these are agreed labels)
        self.digits = {i: str(i).encode() for i in range(len(self.classes))} if self.classes is not None else None


@dataclass
class ShardResult:
    """What checking one shard found: its problems, and the figures the totals are summed from."""

    problems: list[Problem]
    bytes_read: int
    samples: int
    pixels: tuple[list[int], list[int], list[int]] | None = None  # (count, sum, sum of squares) per channel
    sides: set[int] = field(default_factory=set)  # S of the .npy headers seen
    names: dict[int, Counter] = field(default_factory=dict)  # label -> .json class names seen
    misnamed: list[tuple[int, Problem]] = field(default_factory=list)  # (label, problem): a name not classes[label]


class PixelSums:
    """Exact per-channel count, sum and sum of squares of pixel bytes, added piece by piece.

    A byte's channel is its position in the pixel data mod 3; each piece is added to slots that keep
    that phase (slot mod 3 = channel): widened to uint16 once, added to uint16 sums (at most 257
    pieces per slot before they are flushed), squared in place and added to uint32 sums of squares
    (65,536), so the work per byte is four vector ops (2.5 GB/s on one core of the 2-core VM).
    Small pieces (small images) are first gathered, each at a position of its phase with zeros
    between them, so the vector ops run on large arrays.
    """

    SLOTS = 3 << 16  # a 224 px .npy (150,528 bytes) in one piece; a multiple of 768
    SMALL = 1 << 14  # pieces below this are gathered into a buffer of up to STAGE bytes
    STAGE = 1 << 17

    def __init__(self) -> None:
        self.acc1 = np.zeros(self.SLOTS, np.uint16)
        self.acc2 = np.zeros(self.SLOTS, np.uint32)
        self.tmp = np.empty(self.SLOTS, np.uint16)
        self.pieces1 = self.pieces2 = 0
        self.high = 0  # slots past this are still zero
        self.stage = bytearray()
        self.count, self.s1, self.s2 = [0, 0, 0], [0, 0, 0], [0, 0, 0]

    def add(self, data: bytes | bytearray | memoryview, phase: int) -> None:
        """Add the pixel bytes ``data``, whose first byte is of channel ``phase`` (0 R, 1 G, 2 B)."""
        n = len(data)
        q, r = divmod(n, 3)
        count = self.count
        count[0] += q
        count[1] += q
        count[2] += q
        if r:
            count[phase] += 1
            if r == 2:
                count[(phase + 1) % 3] += 1
        if n >= self.SMALL:
            self._add(np.frombuffer(data, np.uint8), phase)
            return
        stage = self.stage
        stage += bytes((phase - len(stage)) % 3)  # zeros: they add nothing to either sum
        stage += data
        if len(stage) >= self.STAGE:
            self._add(np.frombuffer(stage, np.uint8), 0)
            self.stage = bytearray()

    def _add(self, a: np.ndarray, phase: int) -> None:
        pos = 0
        while pos < len(a):
            n = min(self.SLOTS - 2, len(a) - pos)
            ph = (phase + pos) % 3
            if self.pieces1 == 257:
                self._flush(self.acc1, self.s1)
                self.pieces1 = 0
            if self.pieces2 == 65536:
                self._flush(self.acc2, self.s2)
                self.pieces2 = 0
            self.high = max(self.high, ph + n)
            wide = self.tmp[:n]
            np.copyto(wide, a[pos : pos + n])  # no ufunc below casts: each runs at memory speed
            np.add(self.acc1[ph : ph + n], wide, out=self.acc1[ph : ph + n])
            np.multiply(wide, wide, out=wide)  # 255² fits uint16
            np.add(self.acc2[ph : ph + n], wide, out=self.acc2[ph : ph + n])
            self.pieces1 += 1
            self.pieces2 += 1
            pos += n

    def _flush(self, acc: np.ndarray, into: list[int]) -> None:
        used = acc[: -(-self.high // 768) * 768].reshape(-1, 768)  # wide rows: the reduction is vectorized
        for c, v in enumerate(used.sum(axis=0, dtype=np.uint64).reshape(-1, 3).sum(axis=0).tolist()):
            into[c] += int(v)
        used.fill(0)

    def totals(self) -> tuple[list[int], list[int], list[int]]:
        """(count, sum, sum of squares) per channel of every byte added."""
        if self.stage:
            self._add(np.frombuffer(self.stage, np.uint8), 0)
            self.stage = bytearray()
        self._flush(self.acc1, self.s1)
        self._flush(self.acc2, self.s2)
        self.pieces1 = self.pieces2 = self.high = 0
        return list(self.count), list(self.s1), list(self.s2)


_json = json.JSONDecoder().decode  # json.loads less its per-call encoding detection


def _capture(name: str) -> int:
    return (
        NPY_HEADER_BYTES
        if name.endswith(".npy")
        else CLS_CAP
        if name.endswith((".cls", ".i32"))
        else JSON_CAP
        if name.endswith(".json")
        else 0
    )


def reference_header(index: Partial, tf: TableFacts | None) -> bytes | None:
    """The .npy header members are compared with: of the size samples.npz's npy_length says when
    uniform (a wrong ``size`` is then one problem, not one per sample), else of ``size``."""
    side = (tf.npy_size if tf is not None else None) or index.size or (index.sample and index.sample.npy_shape[0])
    return image_header(side) if side else None


def check_shard(job: ShardJob, ctx: Context) -> ShardResult:
    """Every check of one shard (quick: without reading the data of .npy members)."""
    try:
        rows = _read_rows(job, ctx)
    except OSError as e:
        return ShardResult([Problem(job.name, "index", f"cannot read this shard's rows of samples.npz: {e}")], 0, 0)
    if ctx.quick:
        try:
            walker = walk_headers(job.url, _capture)
        except OSError as e:
            return ShardResult([read_problem(job.name, job.url, e)], 0, 0)
        problems = _size_problem(job, walker.pos)
        result = ShardResult(problems, len(walker.members) * BLOCK, 0)
        digests, sha_ok, rehashed = None, None, {}
    else:
        scan = _Scan(ctx.stats, rehash=ctx.phash and "phash" in ctx.usable)
        try:
            file_size(job.url)  # a missing file is named as such before a stream (gopen) would hide it
            scan_file(job.url, on_chunk=scan.on_chunk, walker=scan.walker)
        except OSError as e:
            return ShardResult([read_problem(job.name, job.url, e, scan.walker.pos)], scan.walker.pos, 0)
        walker = scan.walker
        problems = _size_problem(job, walker.pos)
        digest = scan.sha.hexdigest()
        sha_ok = digest == job.sha256
        if not sha_ok and job.sha256 is not None:  # (an unusable sha256 field is a problem already)
            problems.append(
                Problem(job.name, "sha256", f"sha256 {digest[:16]}..., the index says {str(job.sha256)[:16]}...")
            )
        result = ShardResult(problems, walker.pos, 0)
        scan.rehash()
        digests, rehashed = scan.digests, scan.rehashed
        if walker.error is None and sha_ok and scan.pixels is not None:  # from the bytes as converted, or not at all
            result.pixels = scan.pixels.totals()
    for header in {m.data for m in walker.members if m.name.endswith(".npy")}:
        side = image_side_or_none(header)
        if side is not None:
            result.sides.add(side)
    if rows is None:  # no usable rows: the shard's own structure only
        result.problems += walk_problems(job.name, walker) + _headers(job, walker, None)
        result.samples = sum(1 for m in walker.members if m.name.endswith(".npy"))
        result.problems = capped(result.problems)
        return result
    result.samples = len(rows.keys)
    structure = _compare(job, walker, rows, ctx.header, ctx.members)
    content = _contents(job, ctx, rows, walker, (digests, rehashed), sha_ok, result)
    if not ctx.quick and walker.error is not None:
        content += _unreached(job, ctx, rows, walker, result)
    result.problems += structure + content
    if sha_ok is False and job.sha256 is not None and not structure and not content:
        where = "the damage is in tar headers, padding or the end blocks"
        result.problems.append(Problem(job.name, "sample_data", f"the data of every indexed member matches; {where}"))
    if result.problems and any(p.kind == "npy_header" for p in result.problems):
        result.pixels = None  # pixels of a member of another shape are not counted
    result.problems = capped(result.problems)
    return result


class _Scan:
    """Full mode's per-chunk work: SHA-256 of the file, XXH3-64 of each .npy member, pixel sums."""

    def __init__(self, stats: bool = True, rehash: bool = False) -> None:
        self.sha = hashlib.sha256()
        self.walker = TarWalker(_capture)
        self.pixels = PixelSums() if stats else None
        self.digests: dict[int, int] = {}  # .npy data offset -> XXH3-64 of the member
        self.rehashed: dict[int, list[int]] = {}  # .npy data offset -> phash of its pixels (rehash)
        self._npy: bytearray | None = bytearray() if rehash else None  # the member so far
        self._pending: list[tuple[int, bytearray]] = []  # members read, not hashed yet
        self._held = 0  # their bytes
        self._hash: xxhash.xxh3_64 | None = None
        self._done = 0  # members before this one are complete

    def on_chunk(self, part: memoryview) -> None:
        self.sha.update(part)  # releases the GIL: another thread's shard is walked meanwhile
        end = self.walker.pos
        base = end - len(part)
        members = self.walker.members
        i = self._done
        while i < len(members):
            m = members[i]
            if m.name.endswith(".npy"):
                lo, hi = max(m.offset, base), min(m.offset + m.size, end)
                if lo < hi:
                    if self._hash is None:
                        self._hash = xxhash.xxh3_64()
                    self._hash.update(part[lo - base : hi - base])
                    if self._npy is not None:
                        self._npy += part[lo - base : hi - base]
                    start = max(lo, m.offset + NPY_HEADER_BYTES)
                    if start < hi and self.pixels is not None:
                        self.pixels.add(part[start - base : hi - base], (start - m.offset - NPY_HEADER_BYTES) % 3)
                if m.offset + m.size > end:
                    break  # it goes on in the next chunk
                self.digests[m.offset] = (self._hash or xxhash.xxh3_64()).intdigest()
                self._hash = None
                if self._npy is not None:
                    self._pending.append((m.offset, self._npy))
                    self._npy = bytearray()
                    self._held += len(self._pending[-1][1])
                    if self._held >= 1 << 20 or len(self._pending) >= 256:  # hashed a few at a time: in cache
                        self.rehash()
            i += 1
        self._done = i

    def rehash(self) -> None:
        """phash of the pending members."""
        self.rehashed.update(phashes_of(self._pending))
        self._pending, self._held = [], 0


@dataclass
class _Rows:
    """A shard's rows of samples.npz as Python values (each sample is looked at once, in Python)."""

    keys: list[str]
    labels: list[int]
    offsets: list[list[int]]  # per row: data offsets of each member (Context.members order)
    lengths: list[list[int]]
    xxh3: list[int] | None
    fingerprints: list[str] | None  # "xxh3_128:<hex>", as the .json has it
    dims: dict[str, list[int]]  # width, height
    paths: list[str] | None
    meta: list[dict] | None = None  # the .json "meta" each row expects (None: not compared)
    phash: list[list[int]] | None = None  # samples.npz phash, 7 per row (format version 3)


def _read_rows(job: ShardJob, ctx: Context) -> _Rows | None:
    need = row_columns(ctx.members)
    if job.rows is None or ctx.table is None or not set(need) <= ctx.usable:
        return None
    a, b = job.rows
    cols = ctx.table.read([c for c in need + ROW_EXTRA if c in ctx.usable], a, b)
    paths = None
    if ctx.paths_ok:
        po = ctx.table.read(["path_offsets"], a, b + 1)["path_offsets"].astype(np.int64)
        data = ctx.table.read(["path_data"], int(po[0]), int(po[-1]))["path_data"].tobytes()
        paths = [data[s - po[0] : e - po[0]].decode("utf-8", "replace") for s, e in zip(po[:-1], po[1:])]
    fp = cols.get("fingerprint")
    meta = None
    if ctx.metadata:
        meta = row_meta(ctx.table.read(block_names(ctx.metadata), a, b), ctx.metadata, ctx.categories)
    return _Rows(
        cols["key"].astype("U").tolist(),
        cols["label"].tolist(),
        np.stack([cols[f"{column_prefix(m)}_offset"] for m in ctx.members], axis=1).tolist(),
        np.stack([cols[f"{column_prefix(m)}_length"] for m in ctx.members], axis=1).tolist(),
        cols["npy_xxh3"].tolist() if "npy_xxh3" in cols else None,
        ["xxh3_128:" + r.tobytes().hex() for r in fp] if fp is not None else None,
        {d: cols[d].tolist() for d in ("width", "height") if d in cols},
        paths,
        meta,
        cols["phash"].tolist() if "phash" in cols else None,
    )


def _size_problem(job: ShardJob, size: int) -> list[Problem]:
    if size == job.bytes or job.bytes is None:  # (an unusable bytes field is a problem already)
        return []
    what = "truncated" if size < job.bytes else "longer than indexed"
    return [Problem(job.name, "size", f"{what}: {size:,} bytes, the index says {job.bytes:,}")]


def read_problem(name: str, url: str, e: OSError, after: int | None = None) -> Problem:
    """A shard that is missing, or that cannot be opened or read (on) ``after`` so many bytes."""
    if isinstance(e, FileNotFoundError):
        return Problem(name, "missing", f"{url} does not exist")
    at = f" (after {after:,} bytes)" if after is not None else ""
    return Problem(name, "unreadable", f"cannot read {url}{at}: {e.strerror or e}")


def walk_problems(name: str, walker: TarWalker, more: str = "", key: str | None = None) -> list[Problem]:
    """Where the walk of the tar stopped early, if it did."""
    if not walker.error:
        return []
    kind = "truncated" if walker.error.startswith("truncated") else "tar_header"
    return [Problem(name, kind, walker.error + more, key=key, offset=walker.error_offset)]


def header_problem(name: str, member: str, header: bytes, expected: bytes | None, offset: int | None) -> Problem:
    """A .npy member whose header is not ``expected`` (None: not of any [S, S, 3] uint8 image)."""
    want = describe_npy(expected) if expected is not None else "dtype |u1, shape [S, S, 3]"
    what = f"{member}: the header says {describe_npy(header)}; expected {want}"
    return Problem(name, "npy_header", what, key=split_name(member)[0], offset=offset)


def _headers(job: ShardJob, walker: TarWalker, header: bytes | None) -> list[Problem]:
    return [
        header_problem(job.name, m.name, m.data, header, m.offset)
        for m in walker.members
        if m.name.endswith(".npy") and (m.data != header if header is not None else image_side_or_none(m.data) is None)
    ]


def _compare(
    job: ShardJob, walker: TarWalker, rows: _Rows, header: bytes | None, members: tuple[str, ...] = MEMBERS
) -> list[Problem]:
    """The tar's member table and .npy headers against the index's rows for this shard."""
    exp = []
    for k, offsets, lengths in zip(rows.keys, rows.offsets, rows.lengths):
        exp += [(f"{k}.{ext}", offsets[j], lengths[j]) for j, ext in enumerate(members)]
    act = [(m.name, m.offset, m.size) for m in walker.members]
    if exp == act and not walker.error:  # the common case: every member where its row says
        return _headers(job, walker, header)
    seen = Counter(n for n, _, _ in act)
    # members past the point where the walk stopped were not reached: the damage there covers them
    reach = walker.reached
    unreached = sum(1 for n, o, _ in exp if n not in seen and o >= reach) if walker.error else 0
    at = walker.error_offset if walker.error else None
    here = [n for n, o, _ in exp if at is not None and o - BLOCK <= at < o + BLOCK]
    problems = walk_problems(
        job.name,
        walker,
        f"; {unreached} indexed member(s) after it were not reached" if unreached else "",
        key=split_name(here[0])[0] if here else None,
    )
    problems += _headers(job, walker, header)
    if exp == act:
        return problems

    def add(kind: str, message: str, member: str, offset: int | None = None) -> None:
        problems.append(Problem(job.name, kind, message, key=split_name(member)[0], offset=offset))

    exp_at = {n: (o, s) for n, o, s in exp}
    for n, c in seen.items():
        if c > 1:
            add("duplicate_member", f"{n} occurs {c} times", n)
    for n, o, s in act:
        if n not in exp_at:
            add("extra_member", f"{n} ({s:,} B) is not in the index", n, o - BLOCK)
    for n, o, _s in exp:
        if n not in seen and not (walker.error and o >= reach):
            add("missing_member", f"{n} is in the index but not in the tar", n, o - BLOCK)
    moved = [(n, o, s, exp_at[n]) for n, o, s in act if n in exp_at and exp_at[n] != (o, s)]
    if moved:
        n, o, s, (eo, es) = moved[0]
        where = f"first {n}: data at {o:,} ({s:,} B), the index says {eo:,} ({es:,} B)"
        problems.append(
            Problem(
                job.name, "member_offset", f"{len(moved)} member(s) are not where the index says; {where}", offset=o
            )
        )
    return problems


def _contents(
    job: ShardJob,
    ctx: Context,
    rows: _Rows,
    walker: TarWalker,
    hashes: tuple[dict[int, int] | None, dict[int, list[int]]],
    sha_ok: bool | None,
    result: ShardResult,
) -> list[Problem]:
    """Each sample's members found where its row says, against the row; ``hashes``: the XXH3-64 and the
    recomputed phash of each .npy member read (full mode), by data offset."""
    digests, rehashed = hashes
    members, exts = walker.members, ctx.members
    M, N = len(exts), exts.index("npy")
    aligned = len(members) == M * len(rows.keys) and all(  # the common case: member M*i + j is row i's
        m.name == f"{k}.{ext}" and m.offset == o[j] and m.size == n[j]
        for k, o, n, group in zip(rows.keys, rows.offsets, rows.lengths, zip(*[iter(members)] * M))
        for j, (ext, m) in enumerate(zip(exts, group))
    )
    at = {} if aligned else {(m.name, m.offset, m.size): m for m in members}
    problems = []
    for i, k in enumerate(rows.keys):
        found: list[Member | None]
        if aligned:
            found = list(members[M * i : M * i + M])
        else:
            o, n = rows.offsets[i], rows.lengths[i]
            found = [at.get((f"{k}.{ext}", o[j], n[j])) for j, ext in enumerate(exts)]
        npy = found[N]
        problems += _check_sample(job, ctx, rows, i, [m.data if m else None for m in found], result)
        if npy is not None and digests is not None and rows.xxh3 is not None and npy.offset in digests:
            problems += _check_xxh3(job, rows, i, digests[npy.offset], sha_ok)
            got = rehashed.get(npy.offset)
            if got is not None and rows.phash is not None and digests[npy.offset] == rows.xxh3[i]:
                problems += phash_problems(job.name, rows.keys[i], rows.offsets[i][-1], got, rows.phash[i])
    return problems


def _check_xxh3(job: ShardJob, rows: _Rows, i: int, got: int, sha_ok: bool | None) -> list[Problem]:
    want = rows.xxh3[i] if rows.xxh3 is not None else got
    if got == want:
        return []
    k = rows.keys[i]
    why = (
        "the shard matches its sha256, so samples.npz npy_xxh3 was changed"
        if sha_ok
        else "the pixel bytes differ from the index"
    )
    what = f"{k}.npy: XXH3-64 {got:016x}, samples.npz npy_xxh3 says {want:016x}: {why}"
    return [Problem(job.name, "sample_data", what, key=k, offset=rows.offsets[i][-1])]  # .npy: the last member


def _check_sample(
    job: ShardJob, ctx: Context, rows: _Rows, i: int, data: list[bytes | None], result: ShardResult
) -> list[Problem]:
    """One sample's .cls, .i32 and .json against its row; ``data``: the captured bytes of each member
    (``ctx.members`` order; None: the member is not where the row says)."""
    k, label, o, n = rows.keys[i], rows.labels[i], rows.offsets[i], rows.lengths[i]
    exts = ctx.members
    problems: list[Problem] = []
    J = exts.index("json")
    n = [n[0], n[J]]  # the lengths used below: .cls's and .json's
    cls, meta = data[0], data[J]

    def bad(kind: str, member: int, message: str) -> None:
        j = (0, J)[member] if member < 2 else member - 2  # 0: .cls, 1: .json, else 2 + position
        problems.append(Problem(job.name, kind, f"{k}.{exts[j]}: {message}", key=k, offset=o[j]))

    def bad_json(message: str) -> None:
        bad("sample_meta", 1, message)

    i32 = data[exts.index("i32")] if "i32" in exts else None
    if i32 is not None:
        got = read_label_i32(i32)
        if got != label:
            bad(
                "label",
                2 + exts.index("i32"),
                f"holds {got if got is not None else i32[:8]!r}"
                f"{'' if got is not None else ' (not 4 bytes)'}, samples.npz label says {label} (the int32 "
                "must equal the .cls and the label)",
            )

    agreed = False
    if cls is None:
        pass
    elif cls == (ctx.digits.get(label) if ctx.digits is not None else str(label).encode()):
        agreed = True
    elif n[0] > CLS_CAP or not (cls.isascii() and cls.isdigit()):
        bad("label", 0, f"holds {cls[:24]!r}, not a class index")
    elif cls != str(label).encode():
        bad("label", 0, f"says {cls.decode()}, samples.npz label says {label}")
    else:
        bad("label", 0, f"says {label}; classes has {len(ctx.classes or ())} name(s)")
    if meta is None:
        return problems
    try:
        obj = _json(meta.decode("utf-8")) if n[1] <= JSON_CAP else None
    except ValueError as e:  # UnicodeDecodeError too
        bad("sample_meta", 1, f"not valid JSON ({e})")
        return problems
    if not isinstance(obj, dict):
        bad("sample_meta", 1, "not a JSON object" if n[1] <= JSON_CAP else f"{n[1]:,} bytes; too long for metadata")
        return problems
    if obj.get("key") != k:
        bad("sample_meta", 1, f"key is {obj.get('key')!r}, not the member's key")
    if agreed and ctx.classes is not None:
        name = obj.get("label")
        result.names.setdefault(label, Counter())[name] += 1
        if name != ctx.classes[label]:
            result.misnamed.append(
                (
                    label,
                    Problem(
                        job.name,
                        "class_name",
                        f"{k}.json: label {name!r}, but classes[{label}] is {ctx.classes[label]!r}",
                        key=k,
                        offset=o[J],
                    ),
                )
            )
    if rows.fingerprints is not None and obj.get("fingerprint") != rows.fingerprints[i]:
        bad_json(f"fingerprint is {obj.get('fingerprint')!r}; samples.npz fingerprint says {rows.fingerprints[i]}")
    for dim, values in rows.dims.items():
        if obj.get(dim) != values[i]:
            bad_json(f"{dim} is {obj.get(dim)!r}; samples.npz {dim} says {values[i]}")
    if rows.paths is not None and obj.get("source_path") != rows.paths[i]:
        bad_json(f"source_path is {obj.get('source_path')!r}; samples.npz path_data says {rows.paths[i]!r}")
    if ctx.dataset is not None:
        for name, want in ctx.dataset.items():
            if obj.get(name) != want:
                bad_json(f"{name} is {obj.get(name)!r}; index.json's is {want!r} (a sample of another dataset?)")
        keys = set(obj) - {"meta"}
        if keys != set(JSON_FIELDS):
            missing, extra = sorted(set(JSON_FIELDS) - keys), sorted(keys - set(JSON_FIELDS))
            bad_json(
                "every sample of a conversion has the same .json fields"
                + (f"; missing {', '.join(missing)}" if missing else "")
                + (f"; extra {', '.join(extra)}" if extra else "")
            )
    if rows.meta is not None and not same_meta(obj.get("meta"), rows.meta[i]):
        bad_json(f"meta is {_short(obj.get('meta'))}; samples.npz's metadata columns say {_short(rows.meta[i])}")
    elif ctx.metadata == () and "meta" in obj:
        bad_json(f"meta is {_short(obj['meta'])}, but index.json lists no metadata columns")
    return problems


def row_meta(
    block: dict[str, np.ndarray], columns: tuple[MetaColumn, ...], categories: dict[int, list[str]]
) -> list[dict]:
    """The ``"meta"`` object of each row of ``block``, as its sample's .json should hold it."""
    per_column = []
    for i, c in enumerate(columns):
        names = npz_names(i, c.type)
        v = block[names[0]]
        if c.type == "string":
            cats = categories[i]
            per_column.append([cats[x] if 0 <= x < len(cats) else None for x in v.tolist()])
        elif c.type == "int":
            per_column.append([None if m else x for x, m in zip(v.tolist(), block[names[1]].tolist())])
        else:
            per_column.append([None if x != x else x for x in v.tolist()])  # NaN: missing
    n = len(block[npz_names(0, columns[0].type)[0]]) if columns else 0
    return [{c.name: per_column[j][r] for j, c in enumerate(columns)} for r in range(n)]


def same_meta(got: object, want: dict) -> bool:
    """Equal values of equal JSON types (45 and 45.0 differ)."""
    return json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True)


def _short(value: object) -> str:
    text = json.dumps(value, sort_keys=True, ensure_ascii=False)
    return text if len(text) <= 120 else text[:117] + "..."


def _unreached(job: ShardJob, ctx: Context, rows: _Rows, walker: TarWalker, result: ShardResult) -> list[Problem]:
    """After the walk stopped early: the indexed samples past that point that lie within the file,
    read at their offsets, so intact ones are not reported (and damaged ones are)."""
    reach, size = walker.reached, walker.pos
    seen = {m.name for m in walker.members}
    wanted = [
        i
        for i, k in enumerate(rows.keys)
        if f"{k}.cls" not in seen
        and rows.offsets[i][0] >= reach
        and all(o + n <= size for o, n in zip(rows.offsets[i], rows.lengths[i]))
    ]
    M = len(ctx.members)
    starts = [rows.offsets[i][j] for i in wanted for j in range(M)]
    ends = [rows.offsets[i][j] + rows.lengths[i][j] for i in wanted for j in range(M)]
    blobs = read_ranges([job.url] * len(starts), starts, ends)
    problems: list[Problem] = []
    for t, i in enumerate(wanted):
        got = blobs[M * t : M * t + M]
        err = next((b for b in got if isinstance(b, BaseException)), None)
        if err is not None:
            return problems + [
                Problem(
                    job.name, "unreadable", f"cannot read {job.url} at {rows.offsets[i][0]:,}: {err}", key=rows.keys[i]
                )
            ]
        members = [b for b in got if not isinstance(b, BaseException)]
        problems += _check_sample(job, ctx, rows, i, list(members), result)
        if rows.xxh3 is not None:
            problems += _check_xxh3(job, rows, i, xxhash.xxh3_64_intdigest(members[-1]), False)
    return problems
