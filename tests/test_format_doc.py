"""docs/FORMAT.md as a spec: a reader written from its recipes alone rebuilds real conversions.

Everything computed here uses hashlib, struct, zlib, json, csv, PIL, numpy and xxhash directly,
following the doc's words; nothing of wds_tools is imported for it (wds_tools only converts, through
its CLI, as a user would). From the sources and the options, the doc reader rebuilds: the keys,
splits, class list and source digest; the plan; every sample's pixels in each resize mode (JPEG
with draft and EXIF orientation, PNG in RGB, RGBA, palette with transparency, 16-bit grey); every
shard byte for byte (so its sha256); samples.npz byte for byte (NPY columns, ZIP records);
index.json, the wids and DALI files byte for byte; errors.jsonl's rows.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
import re
import struct
import sys
import zlib
from collections import Counter
from importlib.metadata import version as package_version
from pathlib import Path

import numpy as np
import pytest
import xxhash
from click.testing import CliRunner
from phashref import doc_hash
from PIL import Image, ImageOps, features

from wds_tools.cli import cli  # the converter under test, run as a user runs it

S = 16
SEED, VAL_FRACTION, SHARD_SIZE = 0, 0.3, 4
MAX_PIXELS = 256_000_000
ALPHA_BACKGROUND, PAD_FILL = (255, 255, 255), (0, 0, 0)
MODES = ("center-crop", "squash", "pad")


# ------------------------------------------------------------------ a corpus of real files


def _photo(w: int, h: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, (max(2, h // 8), max(2, w // 8), 3), dtype=np.uint8)
    arr = np.asarray(Image.fromarray(coarse).resize((w, h), Image.Resampling.BICUBIC)).astype(np.int16)
    return np.clip(arr + rng.integers(-12, 13, (h, w, 1)), 0, 255).astype(np.uint8)


def _jpeg(arr: np.ndarray, **kw) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "JPEG", quality=90, **kw)
    return buf.getvalue()


def _png(im: Image.Image, **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, "PNG", **kw)
    return buf.getvalue()


def write_corpus(root: Path) -> None:
    """Sources meant to hit each rule of the Pixels recipe, and rows hitting the Keys and Planning rules."""
    (root / "img").mkdir(parents=True)
    files: dict[str, bytes] = {}
    for i, (w, h) in enumerate([(96, 72), (300, 200), (75, 51), (51, 75), (12, 10), (640, 481), (33, 97)]):
        files[f"img/j{i}.jpg"] = _jpeg(_photo(w, h, i))  # draft at scales 1 to 8, odd crop margins
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate: stored 120x80, displayed 80x120
    files["img/rot6.jpg"] = _jpeg(_photo(120, 80, 20), exif=exif)
    exif[0x0112] = 3
    files["img/rot3.jpg"] = _jpeg(_photo(90, 64, 21), exif=exif)
    files["img/grey.jpg"] = _jpeg(_photo(70, 90, 22)[..., 0])
    files["img/rgb.png"] = _png(Image.fromarray(_photo(50, 33, 23)))  # crop margin 8.5
    files["img/half.png"] = _png(Image.fromarray(_photo(64, 34, 29)))  # pad: 34 * 16 / 64 = 8.5, rounds to 8
    rgba = np.dstack([_photo(40, 40, 24), np.tile(np.linspace(0, 255, 40, dtype=np.uint8), (40, 1))])
    files["img/rgba.png"] = _png(Image.fromarray(rgba))
    pal = Image.fromarray(_photo(45, 30, 25)).quantize(16)
    files["img/pal.png"] = _png(pal, transparency=3)
    files["img/grey16.png"] = _png(Image.fromarray(_photo(30, 20, 26)[..., 1].astype(np.uint16) * 257 + 7))
    files["img/caf\u00e9.jpg"] = _jpeg(_photo(64, 48, 27))  # a non-ASCII source path
    files["img/truncated.jpg"] = _jpeg(_photo(200, 150, 28))[:900]  # header fine, data cut: decode fails
    for rel, data in files.items():
        (root / rel).write_bytes(data)
    rows = [  # key, path, label, split ("" = hashed)
        ("j0", "img/j0.jpg", "cat", "train"),
        ("j1", "img/j1.jpg", "dog", ""),
        ("j2", "img/j2.jpg", "owl", ""),
        ("j3", "img/j3.jpg", "cat", ""),
        ("j4", "img/j4.jpg", "dog", "val"),
        ("j5", "img/j5.jpg", "owl", ""),
        ("j6", "img/j6.jpg", "cat", ""),
        ("rot 6", "img/rot6.jpg", "dog", ""),
        ("rot3", "img/rot3.jpg", "owl", ""),
        ("x y", "img/grey.jpg", "cat", ""),
        ("x_y", "img/rgb.png", "dog", ""),
        ("rgba", "img/rgba.png", "owl", "train"),
        ("pal", "img/pal.png", "cat", ""),
        ("g16", "img/grey16.png", "dog", ""),
        ("cafe", "img/caf\u00e9.jpg", "owl", ""),
        ("half", "img/half.png", "bat", ""),
        ("cut", "img/truncated.jpg", "cat", ""),
        ("gone", "img/missing.jpg", "bat", "val"),
    ]
    with open(root / "m.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["key", "path", "label", "split"])
        w.writerows(rows)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("formatdoc")
    write_corpus(root)
    return root


@pytest.fixture(scope="module")
def converted(corpus) -> dict[str, Path]:
    """The corpus converted in each resize mode by the CLI, from the corpus folder, --source relative."""
    out = {}
    cwd = os.getcwd()
    os.chdir(corpus)
    try:
        for mode in MODES:
            r = CliRunner().invoke(
                cli,
                [
                    "convert",
                    "--source",
                    "m.csv",
                    "--version",
                    mode,
                    "--size",
                    str(S),
                    "--out",
                    "out",
                    "--resize",
                    mode,
                    "--shard-size",
                    str(SHARD_SIZE),
                    "--val-fraction",
                    str(VAL_FRACTION),
                    "--max-errors",
                    "2",
                    "--sanitize-keys",
                    "--workers",
                    "1",
                    "--quiet",
                ],
            )
            assert r.exit_code == 0, r.output
            out[mode] = corpus / "out" / mode / str(S)
    finally:
        os.chdir(cwd)
    return out


# ------------------------------------------------------------------ the doc reader: rows, keys, plan


def blake(text: str, digest_size: int) -> bytes:
    return hashlib.blake2b(text.encode(), digest_size=digest_size).digest()


def h_split(key: str) -> int:
    return int.from_bytes(blake(f"split:{SEED}:{key}", 8), "big")


def h_order(key: str) -> int:
    return int.from_bytes(blake(f"order:{SEED}:{key}", 8), "big")


def sanitize(originals: list[str]) -> list[str]:
    """Keys, steps 1 to 3."""
    mapped = [re.sub(r"[^A-Za-z0-9_-]", "_", k) or "_" for k in originals]
    cut = [len(m) > 86 for m in mapped]
    mapped = [m[:86] for m in mapped]
    counts = Counter(mapped)
    return [f"{m}-{blake(k, 4).hex()}" if c or counts[m] > 1 else m for k, m, c in zip(originals, mapped, cut)]


def read_rows(root: Path) -> list[dict]:
    with open(root / "m.csv", newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        raw = [(reader.line_num, {k: (v or "").strip() for k, v in rec.items()}) for rec in reader]
    keys = sanitize([r["key"] for _, r in raw])
    rows = []
    for (line, r), key in zip(raw, keys):
        split = r["split"] or ("val" if h_split(key) < VAL_FRACTION * 2**64 else "train")
        rows.append(
            {
                "key": key,
                "source_path": r["path"],
                "label": r["label"],
                "split": split,
                "line": line,
                "original_key": r["key"] if r["key"] != key else None,
                "file": root / r["path"],
            }
        )
    return rows


def classes_of(rows: list[dict]) -> list[str]:
    labels = {r["label"] for r in rows}
    if all(re.fullmatch(r"0|[1-9][0-9]*", s) for s in labels):
        return [str(i) for i in range(max(int(s) for s in labels) + 1)]
    return sorted(labels)


def source_digest(rows: list[dict]) -> str:
    def tail(r):
        return "\t" + compact(r["meta"]) if "meta" in r else ""

    return hashlib.sha256(
        b"".join(f"{r['key']}\t{r['source_path']}\t{r['label']}\t{r['split']}{tail(r)}\n".encode() for r in rows)
    ).hexdigest()


def compact(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def scan_ok(path: Path) -> bool:
    try:
        if path.stat().st_size == 0:
            return False
        with Image.open(path) as im:
            return im.size[0] * im.size[1] <= MAX_PIXELS
    except Exception:
        return False


def plan(rows: list[dict], classes: list[str]) -> list[tuple[str, list[dict]]]:
    """(shard name, rows in write order) of every shard, in index.json order."""
    index = {c: i for i, c in enumerate(classes)}
    shards = []
    for split in sorted({r["split"] for r in rows}):
        members = sorted(
            (r for r in rows if r["split"] == split), key=lambda r: (index[r["label"]], h_order(r["key"]), r["key"])
        )
        n = math.ceil(len(members) / SHARD_SIZE)
        for s in range(n):
            dealt = [r for p, r in enumerate(members) if p % n == s]
            shards.append((f"{split}-{s:06d}.tar", sorted(dealt, key=lambda r: (h_order(r["key"]), r["key"]))))
    return shards


# ------------------------------------------------------------------ the doc reader: pixels


def to_rgb(im: Image.Image) -> Image.Image:
    mode = im.mode
    if mode in ("L", "RGB") and "transparency" in im.info:
        im = im.convert("RGBA")
    elif mode == "RGB":
        return im
    elif mode.startswith("I;16") or mode == "I":  # Pixel values and colour: no sBIT in this corpus
        v = np.clip(np.asarray(im).astype(np.int64), 0, None)
        b = 16 if mode.startswith("I;16") else next(b for b in (8, 16, 24, 32) if v.max() < 2**b)
        return Image.fromarray((v >> (b - 8)).astype(np.uint8), "L").convert("RGB")
    elif mode == "P":
        im = im.convert("RGBA") if "transparency" in im.info else im.convert("RGB")
    elif mode in ("LA", "La", "PA", "RGBa"):
        im = im.convert("RGBA")
    if im.mode == "RGBA":
        bg = Image.new("RGB", im.size, ALPHA_BACKGROUND)
        bg.paste(im, mask=im.getchannel("A"))
        return bg
    return im.convert("RGB")


def doc_pixels(path: Path, mode: str) -> tuple[np.ndarray, int, int]:
    """Pixels, steps 1 to 7: (uint8 [S, S, 3], displayed width, height)."""
    im = Image.open(path)
    w, h = im.size
    try:
        o = int(im.getexif().get(0x0112, 1))
    except Exception:
        o = 1
    o = o if 1 <= o <= 8 else 1
    W, H = (h, w) if o in (5, 6, 7, 8) else (w, h)
    if mode == "squash":
        sx, sy = S / W, S / H
    else:
        sx = sy = S / (min(W, H) if mode == "center-crop" else max(W, H))
    if im.format == "JPEG":
        need = (max(1, math.ceil(W * sx)), max(1, math.ceil(H * sy)))
        im.draft(im.mode, need[::-1] if o in (5, 6, 7, 8) else need)
    im.load()
    if o != 1:
        im = ImageOps.exif_transpose(im)
    im = to_rgb(im)
    w, h = im.size
    lanczos = Image.Resampling.LANCZOS
    if mode == "squash":
        out = im.resize((S, S), lanczos)
    elif mode == "center-crop":
        side = min(w, h)
        left, top = (w - side) / 2, (h - side) / 2
        out = im.resize((S, S), lanczos, box=(left, top, left + side, top + side))
    else:
        k = S / max(w, h)
        nw, nh = max(1, round(w * k)), max(1, round(h * k))
        out = Image.new("RGB", (S, S), PAD_FILL)
        out.paste(im.resize((nw, nh), lanczos), ((S - nw) // 2, (S - nh) // 2))
    return np.asarray(out, dtype=np.uint8), W, H


# ------------------------------------------------------------------ the doc reader: bytes


def tar_header(name: str, size: int) -> bytes:
    h = bytearray(512)
    h[0 : len(name)] = name.encode("ascii")
    h[100:108], h[108:116], h[116:124] = b"0000644\0", b"0000000\0", b"0000000\0"
    h[124:136] = b"%011o\0" % size
    h[136:148] = b"00000000000\0"
    h[148:156] = b" " * 8
    h[156:157] = b"0"
    h[257:265] = b"ustar\x0000"
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def npy_file(arr: np.ndarray) -> bytes:
    shape = repr(tuple(arr.shape))
    text = f"{{'descr': '{arr.dtype.str}', 'fortran_order': False, 'shape': {shape}, }}"
    text += " " * (21 - len(str(arr.shape[0])))
    pad = 64 - (10 + len(text) + 1) % 64
    text += " " * pad + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode("latin1") + arr.tobytes()


def npz_file(columns: list[tuple[str, np.ndarray]]) -> bytes:
    local, central = bytearray(), bytearray()
    for name, arr in columns:
        data, fname = npy_file(arr), f"{name}.npy".encode()
        crc, offset = zlib.crc32(data), len(local)
        local += (
            struct.pack("<IBBHHHHIIIHH", 0x04034B50, 45, 0, 0, 0, 0, 0x21, crc, 0xFFFFFFFF, 0xFFFFFFFF, len(fname), 20)
            + fname
            + struct.pack("<HHQQ", 1, 16, len(data), len(data))
            + data
        )
        central += (
            struct.pack(
                "<IBBBBHHHHIIIHHHHHII",
                0x02014B50,
                45,
                3,
                45,
                0,
                0,
                0,
                0,
                0x21,
                crc,
                len(data),
                len(data),
                len(fname),
                0,
                0,
                0,
                0,
                0o644 << 16,
                offset,
            )
            + fname
        )
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(columns), len(columns), len(central), len(local), 0)
    return bytes(local + central + end)


def classes_digest(classes: list[str]) -> str:
    """FORMAT.md: the first 16 hex digits of SHA-256 of the class list as canonical JSON, UTF-8."""
    return hashlib.sha256(json.dumps(classes, ensure_ascii=False, separators=(",", ":")).encode()).hexdigest()[:16]


def sample_json(r: dict, width: int, height: int, fingerprint: bytes, version: str, classes: list[str]) -> bytes:
    obj = {
        "key": r["key"],
        "label": r["label"],
        "source_path": r["source_path"],
        "width": width,
        "height": height,
        "fingerprint": "xxh3_128:" + fingerprint.hex(),
        "dataset_version": version,
        "classes_digest": classes_digest(classes),
    }
    obj["original_key"] = r["original_key"] if r["original_key"] is not None else r["key"]  # always present
    if "meta" in r:
        obj["meta"] = r["meta"]
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def mean_std(hist: np.ndarray):
    hist = hist.astype(np.float64)
    n = hist.sum(axis=1)
    if not n.all():
        return [0.0] * 3, [0.0] * 3
    v = np.arange(256, dtype=np.float64)
    m = (hist @ v) / n
    sd = np.sqrt(np.maximum((hist @ (v * v)) / n - m * m, 0.0))
    return [round(float(x) / 255, 6) for x in m], [round(float(x) / 255, 6) for x in sd]


def rebuild(
    root: Path,
    mode: str,
    rows: list[dict] | None = None,
    *,
    version: str | None = None,
    metadata: list[dict] | None = None,
    build: dict | None = None,
) -> dict[str, bytes]:
    """Every file of a conversion (but errors.jsonl), from the sources and FORMAT.md alone: of m.csv
    (``rows`` None), or of ``rows`` with their ``metadata`` columns and the ``build`` fields they add."""
    version = version or mode
    rows = read_rows(root) if rows is None else rows
    classes = classes_of(rows)
    label_index = {c: i for i, c in enumerate(classes)}
    good = [r for r in rows if scan_ok(r["file"])]
    files: dict[str, bytes] = {}
    cols: dict[str, list] = {
        c: []
        for c in (
            "key",
            "label",
            "shard",
            "fingerprint",
            "width",
            "height",
            "src_size",
            "cls_offset",
            "cls_length",
            "i32_offset",
            "i32_length",
            "json_offset",
            "json_length",
            "npy_offset",
            "npy_length",
            "npy_xxh3",
            "phash",
            "path",
        )
    }
    shards, splits, hist = [], {}, {}
    for number, (name, members) in enumerate(plan(good, classes)):
        split = name.rsplit("-", 1)[0]
        hist.setdefault(split, np.zeros((3, 256), np.int64))
        tar, written = bytearray(), 0
        for r in members:
            try:
                pixels, width, height = doc_pixels(r["file"], mode)
            except Exception:
                continue  # a decode failure: the shard is one sample short
            data = r["file"].read_bytes()
            st = r["file"].stat()
            npy = npy_file(pixels)
            entry = {
                "cls": str(label_index[r["label"]]).encode(),
                "i32": struct.pack("<i", label_index[r["label"]]),
                "json": sample_json(r, width, height, xxhash.xxh3_128_digest(data), version, classes),
                "npy": npy,
            }
            for ext, payload in entry.items():
                tar += tar_header(f"{r['key']}.{ext}", len(payload))
                cols[f"{ext}_offset"].append(len(tar))
                cols[f"{ext}_length"].append(len(payload))
                tar += payload + bytes(-len(payload) % 512)
            cols["key"].append(r["key"].encode())
            cols["label"].append(label_index[r["label"]])
            cols["shard"].append(number)
            cols["fingerprint"].append(xxhash.xxh3_128_digest(data))
            cols["width"].append(width)
            cols["height"].append(height)
            cols["src_size"].append(st.st_size)
            cols["npy_xxh3"].append(xxhash.xxh3_64_intdigest(npy))
            cols["phash"].append(doc_hash(pixels))
            cols["path"].append(r["source_path"].encode())
            cols.setdefault("meta", []).append(r.get("meta"))
            for c in range(3):
                hist[split][c] += np.bincount(pixels[..., c].ravel(), minlength=256)
            sp = splits.setdefault(split, {"samples": 0, "shards": 0, "class_counts": [0] * len(classes)})
            sp["samples"] += 1
            sp["class_counts"][label_index[r["label"]]] += 1
            written += 1
        tar += bytes(1024)
        tar += bytes(-len(tar) % 10240)
        files[name] = bytes(tar)
        splits.setdefault(split, {"samples": 0, "shards": 0, "class_counts": [0] * len(classes)})["shards"] += 1
        shards.append(
            {
                "name": name,
                "split": split,
                "samples": written,
                "bytes": len(tar),
                "sha256": hashlib.sha256(tar).hexdigest(),
            }
        )
    n = max([len(k) for k in cols["key"]] + [1])
    paths = cols.pop("path")
    metas = cols.pop("meta", [])
    table = [
        ("key", np.array(cols["key"], dtype=f"|S{n}")),
        ("label", np.array(cols["label"], "<i4")),
        ("shard", np.array(cols["shard"], "<u4")),
        ("fingerprint", np.frombuffer(b"".join(cols["fingerprint"]), "|u1").reshape(-1, 16)),
    ]
    table += [
        (c, np.array(cols[c], d))
        for c, d in [
            ("width", "<u4"),
            ("height", "<u4"),
            ("src_size", "<u8"),
            ("cls_offset", "<u8"),
            ("cls_length", "<u8"),
            ("i32_offset", "<u8"),
            ("i32_length", "<u8"),
            ("json_offset", "<u8"),
            ("json_length", "<u8"),
            ("npy_offset", "<u8"),
            ("npy_length", "<u8"),
            ("npy_xxh3", "<u8"),
            ("phash", "<u8"),
        ]
    ]
    table += [
        ("path_offsets", np.array([0] + list(np.cumsum([len(p) for p in paths])), "<u8")),
        ("path_data", np.frombuffer(b"".join(paths), "|u1")),
    ]
    table += metadata_arrays(metadata or [], metas)
    files["samples.npz"] = npz_file(table)
    for split, sp in splits.items():
        sp["urls"] = f"{split}-000000.tar" if sp["shards"] == 1 else f"{split}-{{000000..{sp['shards'] - 1:06d}}}.tar"
        sp["mean"], sp["std"] = mean_std(hist[split])
        files[f"{split}.wids.json"] = (
            json.dumps(
                {
                    "__kind__": "wids-shard-index-v1",
                    "wids_version": 1,
                    "name": f"{version}/{S}/{split}",
                    "shardlist": [
                        {"url": s["name"], "nsamples": s["samples"], "filesize": s["bytes"]}
                        for s in shards
                        if s["split"] == split
                    ],
                },
                sort_keys=True,
                indent=1,
            )
            + "\n"
        ).encode()
    for number, s in enumerate(shards):
        lines = [f"v1.2 {s['samples']}"]
        for r in (i for i, sh in enumerate(cols["shard"]) if sh == number):
            lines.append(
                " ".join(
                    f"{e} {cols[f'{e}_offset'][r]} {cols[f'{e}_length'][r]} {cols['key'][r].decode()}.{e}"
                    for e in ("cls", "i32", "json", "npy")
                )
            )
        files[s["name"][:-4] + ".idx"] = ("\n".join(lines) + "\n").encode()
    top = hist["train"] if "train" in hist else sum(hist.values())
    mean, std = mean_std(top)
    meta = {
        "format": "wds-tools-index",
        "format_version": 3,
        "created_by": f"wds-tools {package_version('wds-tools')}",
        "dataset_version": version,
        "size": S,
        "resize": mode,
        "decode": {
            "draft": True,
            "filter": "lanczos",
            "alpha_background": list(ALPHA_BACKGROUND),
            "pad_fill": list(PAD_FILL),
            "max_pixels": MAX_PIXELS,
            "colour": "srgb",
        },
        "decoder_versions": {"pillow": Image.__version__, "libjpeg": str(features.version("jpg"))},
        "build": {
            "shard_size": SHARD_SIZE,
            "seed": SEED,
            "val_fraction": VAL_FRACTION,
            "sanitize_keys": True,
            "source": {"kind": "csv", "rows": len(rows), "digest": source_digest(rows)},
            "source_path": "m.csv",
            "base": None,
            **(build or {}),
        },
        "sample": {"members": ["cls", "i32", "json", "npy"], "npy_dtype": "uint8", "npy_shape": [S, S, 3]},
        "classes": classes,
        "classes_digest": classes_digest(classes),
        "class_counts": [sum(sp["class_counts"][c] for sp in splits.values()) for c in range(len(classes))],
        "samples": len(cols["key"]),
        "mean": mean,
        "std": std,
        "stats_split": "train" if "train" in splits else "all",
        "splits": splits,
        "shards": shards,
        "samples_file": {
            "name": "samples.npz",
            "bytes": len(files["samples.npz"]),
            "sha256": hashlib.sha256(files["samples.npz"]).hexdigest(),
        },
        "errors_file": "errors.jsonl",
        "phash_flat_rules": 2,  # FORMAT.md: both rules of The perceptual hash
    }
    if metadata:
        meta["metadata"] = metadata
    files["index.json"] = (json.dumps(meta, sort_keys=True, indent=1, ensure_ascii=False) + "\n").encode()
    return files


# ------------------------------------------------------------------ the tests


@pytest.mark.parametrize("mode", MODES)
def test_every_file_rebuilt_from_the_doc_is_the_converters(corpus, converted, mode):
    folder = converted[mode]
    want = rebuild(corpus, mode)
    on_disk = sorted(p.name for p in folder.iterdir() if p.name != "errors.jsonl")
    assert sorted(want) == on_disk
    for name, data in want.items():
        got = (folder / name).read_bytes()
        if name == "index.json":  # compare field by field first, for a readable failure
            assert json.loads(data) == json.loads(got)
        assert data == got, name


def test_the_corpus_exercises_the_rules(corpus, converted):
    """The doc reader is not trivially right: the corpus hits draft scales 1 to 8, EXIF, transparency,
    16-bit grey, non-ASCII paths, sanitized and colliding keys, hashed and given splits, both failures."""
    rows = read_rows(corpus)
    keys = {r["key"] for r in rows}
    assert {"rot_6", "x_y-" + blake("x y", 4).hex(), "x_y-" + blake("x_y", 4).hex()} <= keys
    scales = set()
    for r in rows:
        if r["file"].suffix == ".jpg" and scan_ok(r["file"]):
            with Image.open(r["file"]) as im:
                w, h = im.size
                im.draft(im.mode, (S, S))
                scales.add(round(w / im.size[0]))
    assert scales == {1, 2, 4, 8}
    meta = json.loads((converted["pad"] / "index.json").read_text())
    assert meta["classes"] == ["bat", "cat", "dog", "owl"]
    errors = [json.loads(line) for line in (converted["pad"] / "errors.jsonl").read_text().splitlines()]
    assert [(e["key"], e["path"], e["line"], e["stage"]) for e in errors] == [
        ("cut", "img/truncated.jpg", 18, "decode"),
        ("gone", "img/missing.jpg", 19, "scan"),
    ]
    assert {r["split"] for r in rows if r["split"] and r["key"] not in ("j0", "j4", "rgba", "gone")} == {"train", "val"}


def test_center_crop_is_one_resampling_of_the_exact_box(corpus, converted):
    """The obvious other readings (crop to whole pixels, then resize; or resize the short side, then
    crop) give other pixels, so the doc has to say which one it is."""
    folder = converted["center-crop"]
    with np.load(folder / "samples.npz") as z:
        keys = [k.decode() for k in z["key"]]
    stored = {}
    for shard in sorted(folder.glob("*.tar")):
        data = shard.read_bytes()
        pos = 0
        while data[pos : pos + 512] != bytes(512):
            name = data[pos : pos + 100].rstrip(b"\0").decode()
            size = int(data[pos + 124 : pos + 135], 8)
            if name.endswith(".npy"):
                stored[name[:-4]] = np.frombuffer(data, np.uint8, S * S * 3, pos + 512 + 128).reshape(S, S, 3)
            pos += 512 + size + (-size % 512)
    assert sorted(stored) == sorted(keys)
    differs = 0
    for r in read_rows(corpus):
        if r["key"] not in stored:
            continue
        assert np.array_equal(doc_pixels(r["file"], "center-crop")[0], stored[r["key"]])
        im = to_rgb(ImageOps.exif_transpose(Image.open(r["file"])))
        w, h = im.size
        side = min(w, h)
        left, top = (w - side) // 2, (h - side) // 2
        whole = np.asarray(im.crop((left, top, left + side, top + side)).resize((S, S), Image.Resampling.LANCZOS))
        differs += not np.array_equal(whole, stored[r["key"]])
    assert differs >= len(stored) // 2


@pytest.mark.parametrize("odd", ["07", "\u00b2", "\u0663", "-1"])
def test_digit_labels_that_are_not_integers_do_not_crash(tmp_path, odd):
    (tmp_path / "img").mkdir()
    with open(tmp_path / "m.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["key", "path", "label"])
        for i, label in enumerate([odd, "3", "10"]):
            (tmp_path / "img" / f"{i}.jpg").write_bytes(_jpeg(_photo(20, 20, i)))
            w.writerow([f"k{i}", f"img/{i}.jpg", label])
    r = CliRunner().invoke(
        cli,
        [
            "convert",
            "--source",
            str(tmp_path / "m.csv"),
            "--version",
            "v1",
            "--size",
            "8",
            "--out",
            str(tmp_path / "out"),
            "--workers",
            "1",
            "--quiet",
        ],
    )
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    if r.exit_code == 0:  # converted: each .cls is its json label's position in classes
        meta = json.loads((tmp_path / "out/v1/8/index.json").read_text())
        for label in (odd, "3", "10"):
            assert label in meta["classes"]
    else:
        assert odd in r.output


def test_samples_npz_bytes_do_not_depend_on_the_os(monkeypatch):
    """Python's zipfile writes host 0 (MS-DOS) in 'version made by' on Windows unless told otherwise."""
    from wds_tools.format.index import write_npz  # the writer itself: the bug is in it

    columns = {"key": np.array([b"a", b"bc"]), "label": np.array([0, 1], "<i4")}
    here = write_npz(columns)
    assert here == npz_file(list(columns.items()))  # the doc's bytes, on this OS
    monkeypatch.setattr(sys, "platform", "win32")
    assert write_npz(columns) == here


# ------------------------------------------------------------------ version 2: a dataset's own metadata file

META_HEADER = ["lesion_id", "image_id", "dx", "dx_type", "age", "sex", "localization", "code", "count"]
META_OPTIONS = [
    "--key",
    "image_id",
    "--label",
    "dx",
    "--path",
    "images/{image_id}.jpg",
    "--group",
    "lesion_id",
    "--stratify",
]
META_BUILD = {
    "columns": {"key": "image_id", "label": "dx", "path": "images/{image_id}.jpg", "split": None},
    "group": "lesion_id",
    "stratify": True,
}
# (lesion, dx of each image): lesion L4's labels tie (its class is the smaller index, mel), two images have no
# lesion (each its own unit), ISIC_0000005's file is missing (a scan failure; its site is in no other row)
LESIONS = [
    ("L1", "nv nv nv"),
    ("L2", "mel"),
    ("L3", "nv nv"),
    ("", "bkl"),
    ("L4", "nv mel nv mel"),
    ("L5", "mel mel"),
    ("", "nv"),
    ("L6", "bkl"),
    ("L7", "mel bkl mel"),
    ("L8", "nv"),
    ("L9", "nv nv"),
    ("L10", "bkl bkl"),
]
NEW_LESIONS = [("L11", "mel mel"), ("L12", "nv"), ("L2", "mel")]  # the second version: two new lesions, L2 grows
MISSING_IMAGE = "ISIC_0000005"


def _meta_cells(n: int, lesion: str, dx: str) -> list[str]:
    """A HAM10000-shaped row: floats written several ways, a code with leading zeros (text), an int
    column with negatives and gaps, unicode sites, missing cells."""
    site = (
        "only-the-failed-row"
        if f"ISIC_{n:07d}" == MISSING_IMAGE
        else ["back", "\u00e9paule", "\u982d\u76ae", "", "lower extremity", "back"][n % 6]
    )
    return [
        lesion,
        f"ISIC_{n:07d}",
        dx,
        ["histo", "follow_up", "consensus"][n % 3],
        ["45", "60.5", "+3", ".5", "", "1e1", "70"][n % 7],
        ["male", "female", ""][n % 3],
        site,
        ["007", "12", "0"][n % 3],
        ["3", "-1", "", "0"][n % 4],
    ]


def write_meta_corpus(root: Path, lesions=LESIONS) -> list[list[str]]:
    (root / "images").mkdir(parents=True, exist_ok=True)
    rows, n = [], 0
    for lesion, dxs in lesions:
        for dx in dxs.split():
            image = f"ISIC_{n:07d}"
            if image != MISSING_IMAGE:
                (root / "images" / f"{image}.jpg").write_bytes(_jpeg(_photo(40 + n, 30 + n % 7, 100 + n)))
            rows.append(_meta_cells(n, lesion, dx))
            n += 1
    with open(root / "meta.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(META_HEADER)
        w.writerows(rows)
    return rows


def convert_meta(root: Path, version: str, val_fraction: float) -> Path:
    cwd = os.getcwd()
    os.chdir(root)
    try:
        r = CliRunner().invoke(
            cli,
            [
                "convert",
                "--source",
                "meta.csv",
                "--version",
                version,
                "--size",
                str(S),
                "--out",
                "out",
                "--shard-size",
                str(SHARD_SIZE),
                "--val-fraction",
                str(val_fraction),
                "--max-errors",
                "2",
                "--sanitize-keys",
                "--workers",
                "1",
                "--quiet",
                *META_OPTIONS,
            ],
        )
        assert r.exit_code == 0, r.output
    finally:
        os.chdir(cwd)
    return root / "out" / version / str(S)


INT_TEXT = re.compile(r"-?(0|[1-9][0-9]*)")
FLOAT_TEXT = re.compile(r"[+-]?((0|[1-9][0-9]*)(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")


def column_type(texts: list[str | None]) -> str:
    """Metadata, 'A column's type'."""
    present = [t for t in texts if t is not None]

    def is_int(t):
        return bool(INT_TEXT.fullmatch(t)) and -(2**63) <= int(t) < 2**63

    def is_float(t):
        if INT_TEXT.fullmatch(t):
            return is_int(t) and float(int(t)) == int(t)  # an integer a double holds exactly
        return bool(FLOAT_TEXT.fullmatch(t)) and math.isfinite(float(t))

    if present and all(map(is_int, present)):
        return "int"
    if present and all(map(is_float, present)):
        return "float"
    return "string"


def unit_text(value) -> str:
    """FORMAT.md, Splits per group: a group value as text."""
    if isinstance(value, str):
        if re.fullmatch(r"-?(0|[1-9][0-9]*)", value):
            return str(int(value))
        if re.fullmatch(r"[+-]?((0|[1-9][0-9]*)(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?", value) and math.isfinite(
            float(value)
        ):
            value = float(value)
        else:
            return value
    if isinstance(value, float):
        return str(int(value)) if value == int(value) else repr(value)
    return str(value)


def draw_splits(rows: list[dict], classes: list[str], val_fraction: float, fixed: dict) -> None:
    """Planning, 'Splits per group', with --stratify: sets each row's split."""
    index = {c: i for i, c in enumerate(classes)}
    units: dict[tuple, Counter] = {}
    for r in rows:
        lesion = r["meta"]["lesion_id"]
        r["unit"] = ("g", unit_text(lesion)) if lesion is not None else ("k", r["key"])
        units.setdefault(r["unit"], Counter())[index[r["label"]]] += 1
    p, q = val_fraction.as_integer_ratio()
    split_of = {}
    by_class: dict[int, list] = {}
    for unit, labels in units.items():
        by_class.setdefault(min(labels, key=lambda c: (-labels[c], c)), []).append(unit)
    for members in by_class.values():
        total = sum(sum(units[u].values()) for u in members)
        v = sum(sum(units[u].values()) for u in members if fixed.get(u) == "val")
        free = [u for u in members if u not in fixed]
        h = {u: int.from_bytes(blake(f"group:{SEED}:{u[1]}", 8), "big") if u[0] == "g" else h_split(u[1]) for u in free}
        for u in sorted(free, key=lambda u: (h[u], u)):
            size = sum(units[u].values())
            if (2 * v + size) * q < 2 * p * total:
                split_of[u], v = "val", v + size
            else:
                split_of[u] = "train"
        split_of.update({u: fixed[u] for u in members if u in fixed})
    for r in rows:
        r["split"] = split_of[r["unit"]]


def read_meta_rows(root: Path, val_fraction: float, fixed: dict | None = None) -> tuple[list[dict], list[dict]]:
    """Rows and index.json metadata of meta.csv, from Planning's column rules and Metadata."""
    with open(root / "meta.csv", newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        raw = [(reader.line_num, {k: (v or "").strip() for k, v in rec.items()}) for rec in reader]
        names = [c for c in reader.fieldnames if c not in ("image_id", "dx", "sha256", "md5")]
    texts = [[r[c] or None for c in names] for _, r in raw]
    types = [column_type([t[i] for t in texts]) for i in range(len(names))]
    rows = []
    for (line, r), cells in zip(raw, texts):
        meta = {
            c: None if t is None else int(t) if ty == "int" else float(t) if ty == "float" else t
            for c, t, ty in zip(names, cells, types)
        }
        rows.append(
            {
                "key": r["image_id"],
                "source_path": f"images/{r['image_id']}.jpg",
                "label": r["dx"],
                "line": line,
                "original_key": None,
                "file": root / "images" / f"{r['image_id']}.jpg",
                "meta": meta,
            }
        )
    draw_splits(rows, classes_of(rows), val_fraction, fixed or {})
    return rows, [{"name": c, "type": t} for c, t in zip(names, types)]


def metadata_arrays(metadata: list[dict], metas: list[dict]) -> list[tuple[str, np.ndarray]]:
    """samples.npz's metadata arrays (Metadata) of the samples written, ``metas`` their meta objects."""
    out = []
    for i, c in enumerate(metadata):
        values = [m[c["name"]] for m in metas]
        if c["type"] == "int":
            out += [
                (f"meta{i}", np.array([0 if v is None else v for v in values], "<i8")),
                (f"meta{i}_missing", np.array([v is None for v in values], "|b1")),
            ]
        elif c["type"] == "float":
            out += [(f"meta{i}", np.array([np.nan if v is None else v for v in values], "<f8"))]
        else:
            cats = sorted({v for v in values if v is not None})
            data = [v.encode() for v in cats]
            out += [
                (f"meta{i}", np.array([-1 if v is None else cats.index(v) for v in values], "<i4")),
                (f"meta{i}_offsets", np.array([0] + list(np.cumsum([len(d) for d in data])), "<u8")),
                (f"meta{i}_data", np.frombuffer(b"".join(data), "|u1")),
            ]
    return out


@pytest.fixture(scope="module")
def meta_corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("formatdoc-meta")
    write_meta_corpus(root)
    return root


def test_a_metadata_file_with_groups_rebuilt_from_the_doc(meta_corpus):
    """Version 2's additions: column options, typed metadata in each .json and in samples.npz, index.json
    metadata and build fields, stratified per-lesion splits; then a second version whose old lesions keep
    the first's splits (the split base) while new ones are drawn at another val_fraction."""
    folder = convert_meta(meta_corpus, "m1", VAL_FRACTION)
    rows, metadata = read_meta_rows(meta_corpus, VAL_FRACTION)
    assert [c["type"] for c in metadata] == ["string", "string", "float", "string", "string", "string", "int"]
    want = rebuild(
        meta_corpus,
        "center-crop",
        rows,
        version="m1",
        metadata=metadata,
        build={**META_BUILD, "source_path": "meta.csv", "split_base": None},
    )
    assert sorted(want) == sorted(p.name for p in folder.iterdir() if p.name != "errors.jsonl")
    for name, data in want.items():
        got = (folder / name).read_bytes()
        if name == "index.json":
            assert json.loads(data) == json.loads(got)
        assert data == got, name
    assert {r["split"] for r in rows} == {"train", "val"}
    # the corpus exercises the rules: a unit of mixed labels, ungrouped rows, a category only a failed row has
    errors = [json.loads(line) for line in (folder / "errors.jsonl").read_text().splitlines()]
    assert [(e["key"], e["stage"]) for e in errors] == [(MISSING_IMAGE, "scan")]
    assert b"only-the-failed-row" not in want["samples.npz"] and "\u982d\u76ae".encode() in want["samples.npz"]

    # version 2 of the set: L1..L10 keep m1's splits; L11, L12 are drawn (at another val_fraction)
    with open(meta_corpus / "meta.csv", "a", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n")
        n = sum(len(d.split()) for _, d in LESIONS)
        for lesion, dxs in NEW_LESIONS:
            for dx in dxs.split():
                (meta_corpus / "images" / f"ISIC_{n:07d}.jpg").write_bytes(_jpeg(_photo(41, 33, 300 + n)))
                w.writerow(_meta_cells(n, lesion, dx))
                n += 1
    folder2 = convert_meta(meta_corpus, "m2", 0.5)
    with np.load(folder / "samples.npz") as z:  # the base's units, from its samples and lesion column
        index1 = json.loads((folder / "index.json").read_text())
        lesion_col = [c["name"] for c in index1["metadata"]].index("lesion_id")
        offsets, data = z[f"meta{lesion_col}_offsets"], z[f"meta{lesion_col}_data"].tobytes()
        cats = [data[a:b].decode() for a, b in zip(offsets[:-1], offsets[1:])]
        base_split: dict[tuple, set] = {}
        for key, code, shard in zip(z["key"], z[f"meta{lesion_col}"], z["shard"]):
            unit = ("g", cats[code]) if code >= 0 else ("k", key.decode())
            base_split.setdefault(unit, set()).add(index1["shards"][shard]["split"])
    fixed = {u: next(iter(s)) for u, s in base_split.items() if len(s) == 1}
    rows2, metadata2 = read_meta_rows(meta_corpus, 0.5, fixed)
    want2 = rebuild(
        meta_corpus,
        "center-crop",
        rows2,
        version="m2",
        metadata=metadata2,
        build={**META_BUILD, "source_path": "meta.csv", "split_base": "m1", "base": "m1", "val_fraction": 0.5},
    )
    for name, data in want2.items():
        got = (folder2 / name).read_bytes()
        if name == "index.json":
            assert json.loads(data) == json.loads(got)
        assert data == got, name
    by_unit = {r["unit"]: r["split"] for r in rows}
    assert all(r["split"] == by_unit[r["unit"]] for r in rows2 if r["unit"] in by_unit)
    unfixed, _ = read_meta_rows(meta_corpus, 0.5)  # without the base some old lesion would move
    assert any(a["split"] != b["split"] for a, b in zip(unfixed, rows2) if a["unit"] in by_unit)


def test_the_group_text_rule_as_written_is_the_codes():
    """FORMAT.md's rule for a group value as text (``unit_text``, written from the doc) against the
    converter's, on values of every type, including those the conversions above do not hold."""
    from wds_tools.format.meta import value_text

    values = [
        0,
        -3,
        2**63 - 1,
        5.0,
        -0.0,
        45.5,
        1e-07,
        1e20,
        0.1 + 0.2,
        "5.0",
        "5",
        "-0",
        "1e3",
        "45.50",
        ".5",
        "+7",
        "99999999999999999999",
        "007",
        "NaN",
        "inf",
        "1e400",
        " 5",
        "٣",
        "HAM_01",
        "",
    ]
    assert [unit_text(v) for v in values] == [value_text(v) for v in values]
