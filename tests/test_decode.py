"""Tests of wds_tools.convert.decode: source bytes -> uint8 [size, size, 3] pixels.

Every image is made here, in memory, with PIL: uniform colours or big uniform regions, so the
expected pixel values are known exactly (lossless formats) or within a small tolerance (JPEG,
lossy WebP). Checks sample well inside uniform regions so the resampling filter cannot blur them.
"""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageOps

from wds_tools.convert.decode import (
    RESIZE_MODES,
    Decoded,
    DecodeSettings,
    decode_file,
    decode_image,
    decode_sizes,
    probe_image,
)
from wds_tools.errors import DecodeError, OptionError
from wds_tools.synth import jpeg_bytes, photo_like

RED = (255, 0, 0)
GREEN = (0, 255, 0)
BLUE = (0, 0, 255)
WHITE = (255, 255, 255)
BLACK = (0, 0, 0)


# --------------------------------------------------------------------------------------------
# helpers


def encode(im: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **kw)
    return buf.getvalue()


def two_halves(mode: str, size: tuple[int, int], left, right) -> Image.Image:
    """An image of ``mode`` whose left half is ``left`` and right half is ``right``."""
    w, h = size
    im = Image.new(mode, size, left)
    im.paste(right, (w // 2, 0, w, h))
    return im


def assert_colour(region: np.ndarray, expected, tol: int = 0) -> None:
    """Every pixel of ``region`` ([..., 3] uint8) is within ``tol`` of ``expected`` per channel."""
    region = np.asarray(region).reshape(-1, 3).astype(np.int16)
    diff = np.abs(region - np.asarray(expected, dtype=np.int16))
    assert diff.max() <= tol, (
        f"expected {tuple(expected)} +-{tol}, got values from {region.min(axis=0)} to "
        f"{region.max(axis=0)} (max diff {diff.max()})"
    )


def left_right(pixels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Interior of the left and right half of a square output (away from the seam and edges)."""
    s = pixels.shape[0]
    q = s // 4
    return pixels[q : s - q, 1 : s // 2 - 3], pixels[q : s - q, s // 2 + 3 : s - 1]


def png_header_only(width: int, height: int) -> bytes:
    """A PNG with a valid IHDR claiming ``width`` x ``height`` grey pixels, and no pixel data."""

    def chunk(tag: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + tag + body + struct.pack(">I", zlib.crc32(tag + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")


@pytest.fixture(scope="module")
def photo_jpeg() -> bytes:
    """A 2016x1512 photo-like JPEG (half of a 12 MP phone photo per side): draft mode kicks in."""
    return jpeg_bytes(photo_like(2016, 1512, seed=7), quality=92)


@pytest.fixture(scope="module")
def small_jpeg() -> bytes:
    return jpeg_bytes(photo_like(160, 120, seed=3), quality=90)


# --------------------------------------------------------------------------------------------
# modes -> RGB


def test_mode_L_grey_becomes_equal_channels():
    im = two_halves("L", (64, 32), 37, 201)
    d = decode_image(encode(im, "PNG"), 32, "squash")
    left, right = left_right(d.pixels)
    assert_colour(left, (37, 37, 37))
    assert_colour(right, (201, 201, 201))


@pytest.mark.parametrize("mode", ["LA", "RGBA"])
def test_alpha_modes_composite_over_white_by_default(mode):
    if mode == "LA":
        transparent, opaque, opaque_rgb = (90, 0), (140, 255), (140, 140, 140)
    else:
        transparent, opaque, opaque_rgb = (10, 200, 30, 0), (10, 200, 30, 255), (10, 200, 30)
    im = two_halves(mode, (64, 32), transparent, opaque)
    raw = encode(im, "PNG")
    assert Image.open(io.BytesIO(raw)).mode == mode
    d = decode_image(raw, 32, "squash")
    left, right = left_right(d.pixels)
    assert_colour(left, WHITE)  # not the hidden colour under alpha 0
    assert_colour(right, opaque_rgb)


@pytest.mark.parametrize("mode", ["LA", "RGBA"])
def test_alpha_background_setting_is_used(mode):
    transparent = (90, 0) if mode == "LA" else (10, 200, 30, 0)
    raw = encode(Image.new(mode, (16, 16), transparent), "PNG")
    d = decode_image(raw, 8, "squash", DecodeSettings(alpha_background=(12, 34, 56)))
    assert_colour(d.pixels, (12, 34, 56))


def test_semi_transparent_pixels_are_blended():
    raw = encode(Image.new("RGBA", (16, 16), (255, 0, 0, 128)), "PNG")
    d = decode_image(raw, 8, "squash")  # over white: 255 * (1 - 128/255) = 127
    assert_colour(d.pixels, (255, 127, 127), tol=1)
    d = decode_image(raw, 8, "squash", DecodeSettings(alpha_background=(0, 0, 0)))
    assert_colour(d.pixels, (128, 0, 0), tol=1)


def _palette_image() -> Image.Image:
    im = Image.new("P", (64, 32), 0)
    im.putpalette([10, 20, 30, 200, 100, 50] + [0, 0, 0] * 254)
    im.paste(1, (32, 0, 64, 32))
    return im


@pytest.mark.parametrize("fmt", ["PNG", "GIF", "BMP"])
def test_mode_P_palette_colours(fmt):
    raw = encode(_palette_image(), fmt)
    assert Image.open(io.BytesIO(raw)).mode == "P"
    d = decode_image(raw, 32, "squash")
    left, right = left_right(d.pixels)
    assert_colour(left, (10, 20, 30))
    assert_colour(right, (200, 100, 50))


@pytest.mark.parametrize("fmt", ["PNG", "GIF"])
def test_mode_P_transparency_index_over_background(fmt):
    raw = encode(_palette_image(), fmt, transparency=0)  # index 0 = (10, 20, 30) is transparent
    opened = Image.open(io.BytesIO(raw))
    assert opened.mode == "P" and opened.info.get("transparency") == 0
    left, right = left_right(decode_image(raw, 32, "squash").pixels)
    assert_colour(left, WHITE)
    assert_colour(right, (200, 100, 50))
    left, _ = left_right(decode_image(raw, 32, "squash", DecodeSettings(alpha_background=(1, 2, 3))).pixels)
    assert_colour(left, (1, 2, 3))


@pytest.mark.parametrize("fmt, tol", [("TIFF", 0), ("JPEG", 2)])
def test_mode_CMYK(fmt, tol):
    im = two_halves("CMYK", (64, 32), (255, 0, 0, 0), (0, 0, 0, 255))  # pure cyan | pure black
    raw = encode(im, fmt, **({"quality": 100} if fmt == "JPEG" else {}))
    assert Image.open(io.BytesIO(raw)).mode == "CMYK"
    left, right = left_right(decode_image(raw, 32, "squash").pixels)
    assert_colour(left, (0, 255, 255), tol)
    assert_colour(right, BLACK, tol)


@pytest.mark.parametrize("fmt", ["PNG", "TIFF"])
def test_mode_I16_keeps_top_8_bits(fmt):
    arr = np.full((32, 64), 40000, dtype=np.uint16)
    arr[:, 32:] = 1000
    raw = encode(Image.fromarray(arr), fmt)
    assert Image.open(io.BytesIO(raw)).mode.startswith("I;16")
    left, right = left_right(decode_image(raw, 32, "squash").pixels)
    assert_colour(left, (156, 156, 156))  # 40000 >> 8, not clipped to 255
    assert_colour(right, (3, 3, 3))  # 1000 >> 8, not clipped to 255 either


def test_mode_F_is_clipped_and_rounded():
    arr = np.full((32, 64), 100.4, dtype=np.float32)
    arr[:, 32:] = 1e6
    raw = encode(Image.fromarray(arr, "F"), "TIFF")
    assert Image.open(io.BytesIO(raw)).mode == "F"
    left, right = left_right(decode_image(raw, 32, "squash").pixels)
    assert_colour(left, (100, 100, 100))
    assert_colour(right, (255, 255, 255))


@pytest.mark.parametrize("fmt", ["PNG", "BMP", "TIFF"])
def test_mode_1_black_and_white(fmt):
    im = two_halves("1", (64, 32), 0, 1)
    raw = encode(im, fmt)
    assert Image.open(io.BytesIO(raw)).mode == "1"
    left, right = left_right(decode_image(raw, 32, "squash").pixels)
    assert_colour(left, BLACK)
    assert_colour(right, WHITE)


@pytest.mark.parametrize(
    "mode, key, other, other_rgb",
    [("L", 50, 200, (200, 200, 200)), ("RGB", (1, 2, 3), (200, 0, 0), (200, 0, 0))],
)
def test_png_trns_colour_key_is_transparent(mode, key, other, other_rgb):
    raw = encode(two_halves(mode, (64, 32), key, other), "PNG", transparency=key)
    assert Image.open(io.BytesIO(raw)).info.get("transparency") == key
    left, right = left_right(decode_image(raw, 32, "squash").pixels)
    assert_colour(right, other_rgb)
    assert_colour(left, WHITE)


# --------------------------------------------------------------------------------------------
# formats

C1, C2 = (200, 30, 40), (20, 160, 220)


@pytest.mark.parametrize(
    "fmt, kw, tol",
    [
        ("PNG", {}, 0),
        ("WEBP", {"lossless": True}, 0),
        ("WEBP", {"quality": 95}, 8),
        ("GIF", {}, 0),
        ("TIFF", {}, 0),
        ("TIFF", {"compression": "tiff_lzw"}, 0),
        ("BMP", {}, 0),
        ("JPEG", {"quality": 95, "subsampling": 0}, 3),
        ("JPEG", {"quality": 95, "progressive": True}, 3),
    ],
    ids=["png", "webp-lossless", "webp-lossy", "gif", "tiff", "tiff-lzw", "bmp", "jpeg", "jpeg-progressive"],
)
@pytest.mark.parametrize("size", [32, 48])
def test_formats_decode_to_shape_and_colour(fmt, kw, tol, size):
    raw = encode(two_halves("RGB", (96, 48), C1, C2), fmt, **kw)
    opened = Image.open(io.BytesIO(raw))
    assert opened.format == fmt
    if kw.get("progressive"):
        assert opened.info.get("progressive"), "the test image is not a progressive JPEG"
    d = decode_image(raw, size, "squash")
    assert isinstance(d, Decoded)
    assert d.pixels.shape == (size, size, 3) and d.pixels.dtype == np.uint8
    assert (d.width, d.height) == (96, 48)
    left, right = left_right(d.pixels)
    assert_colour(left, C1, tol)
    assert_colour(right, C2, tol)


def test_animated_gif_decodes_first_frame():
    frames = [Image.new("RGB", (32, 32), c) for c in (RED, BLUE, GREEN)]
    raw = encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    assert getattr(Image.open(io.BytesIO(raw)), "n_frames", 1) == 3
    d = decode_image(raw, 16, "squash")
    assert_colour(d.pixels, RED)


# --------------------------------------------------------------------------------------------
# EXIF orientation

# Where the red top-left quadrant of the stored image is displayed, per EXIF orientation (row, col).
_RED_QUADRANT = {1: (0, 0), 2: (0, 1), 3: (1, 1), 4: (1, 0), 5: (0, 0), 6: (0, 1), 7: (1, 1), 8: (1, 0)}


def _marked_image() -> Image.Image:
    im = Image.new("RGB", (96, 48), BLUE)
    im.paste(RED, (0, 0, 48, 24))
    return im


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation(orientation, fmt):
    exif = Image.Exif()
    exif[0x0112] = orientation
    kw = {"quality": 95, "subsampling": 0} if fmt == "JPEG" else {}
    raw = encode(_marked_image(), fmt, exif=exif.tobytes(), **kw)

    # the reference: where PIL's exif_transpose puts the red quadrant
    ref = ImageOps.exif_transpose(Image.open(io.BytesIO(raw)))
    ref_arr = np.asarray(ref.convert("RGB"))
    rh, rw = ref_arr.shape[:2]
    red_ref = {(r, c) for r in (0, 1) for c in (0, 1) if ref_arr[rh // 4 + r * rh // 2, rw // 4 + c * rw // 2, 0] > 128}
    assert red_ref == {_RED_QUADRANT[orientation]}  # the table agrees with PIL

    transposed = orientation in (5, 6, 7, 8)
    expected_size = (48, 96) if transposed else (96, 48)
    assert ref.size == expected_size

    d = decode_image(raw, 32, "squash")
    assert (d.width, d.height) == expected_size
    assert probe_image(raw) == expected_size
    for r in (0, 1):
        for c in (0, 1):
            block = d.pixels[r * 16 + 4 : r * 16 + 12, c * 16 + 4 : c * 16 + 12]
            want = RED if (r, c) == _RED_QUADRANT[orientation] else BLUE
            assert_colour(block, want, tol=8 if fmt == "JPEG" else 0)


@pytest.mark.parametrize("value", [0, 9])
def test_invalid_exif_orientation_is_ignored(value):
    exif = Image.Exif()
    exif[0x0112] = value
    raw = encode(_marked_image(), "PNG", exif=exif.tobytes())
    d = decode_image(raw, 32, "squash")
    assert (d.width, d.height) == (96, 48)
    assert_colour(d.pixels[4:12, 4:12], RED)
    assert_colour(d.pixels[4:12, 20:28], BLUE)


# --------------------------------------------------------------------------------------------
# resize modes


def test_squash_keeps_left_right_and_shape():
    raw = encode(two_halves("RGB", (128, 64), RED, BLUE), "PNG")
    for size in (16, 33, 64):
        d = decode_image(raw, size, "squash")
        assert d.pixels.shape == (size, size, 3)
        left, right = left_right(d.pixels)
        assert_colour(left, RED)
        assert_colour(right, BLUE)


@pytest.mark.parametrize("orient", ["wide", "tall"])
def test_center_crop_keeps_the_centre(orient):
    im = Image.new("RGB", (300, 100), RED)
    im.paste(GREEN, (100, 0, 200, 100))
    if orient == "tall":
        im = im.transpose(Image.Transpose.ROTATE_90)
    d = decode_image(encode(im, "PNG"), 32, "center-crop")
    assert d.pixels.shape == (32, 32, 3)
    assert (d.width, d.height) == im.size
    assert_colour(d.pixels[2:-2, 2:-2], GREEN, tol=2)  # Lanczos lobes reach past the crop box
    # the filter may blend in a trace of the margins at the very edge, never a red column
    assert d.pixels[..., 0].max() < 64


def test_center_crop_is_the_default():
    im = Image.new("RGB", (300, 100), RED)
    im.paste(GREEN, (100, 0, 200, 100))
    raw = encode(im, "PNG")
    np.testing.assert_array_equal(decode_image(raw, 32).pixels, decode_image(raw, 32, "center-crop").pixels)


def test_pad_wide_image_gets_bands_top_and_bottom():
    raw = encode(Image.new("RGB", (128, 64), GREEN), "PNG")
    px = decode_image(raw, 32, "pad").pixels  # content 32x16 at rows 8..23
    assert px.shape == (32, 32, 3)
    assert_colour(px[:8], BLACK)
    assert_colour(px[24:], BLACK)
    assert_colour(px[8:24], GREEN)


def test_pad_tall_image_uses_pad_fill_left_and_right():
    raw = encode(Image.new("RGB", (40, 80), GREEN), "PNG")
    px = decode_image(raw, 32, "pad", DecodeSettings(pad_fill=(9, 8, 7))).pixels  # content 16x32 at cols 8..23
    assert_colour(px[:, :8], (9, 8, 7))
    assert_colour(px[:, 24:], (9, 8, 7))
    assert_colour(px[:, 8:24], GREEN)


@pytest.mark.parametrize("filt", ["lanczos", "bicubic", "bilinear", "box"])
def test_every_filter_keeps_uniform_regions(filt):
    raw = encode(two_halves("RGB", (128, 64), RED, BLUE), "PNG")
    left, right = left_right(decode_image(raw, 32, "squash", DecodeSettings(filter=filt)).pixels)
    assert_colour(left, RED)
    assert_colour(right, BLUE)


def test_unknown_filter_is_an_option_error():
    with pytest.raises(OptionError, match="lanczos"):
        DecodeSettings(filter="nearest")


# --------------------------------------------------------------------------------------------
# draft mode


@pytest.mark.parametrize("resize", RESIZE_MODES)
def test_draft_is_close_to_full_decode(photo_jpeg, resize):
    drafted = decode_image(photo_jpeg, 256, resize).pixels
    full = decode_image(photo_jpeg, 256, resize, DecodeSettings(draft=False)).pixels
    diff = np.abs(drafted.astype(np.int16) - full.astype(np.int16))
    # measured (Pillow 13 / libjpeg-turbo): mean ~0.3-0.5, max 3-4
    assert diff.mean() < 1.5, f"draft decode drifts from the full decode: mean abs diff {diff.mean():.2f}"
    assert diff.max() <= 24
    # ...and the draft path was really taken (DCT-domain scaling is not bit-identical)
    assert not np.array_equal(drafted, full)


def test_draft_reports_full_source_size(photo_jpeg):
    d = decode_image(photo_jpeg, 64, "center-crop")
    assert (d.width, d.height) == (2016, 1512)
    assert probe_image(photo_jpeg) == (2016, 1512)


# --------------------------------------------------------------------------------------------
# determinism and layout


@pytest.mark.parametrize("resize", RESIZE_MODES)
def test_deterministic_contiguous_uint8(small_jpeg, resize):
    a = decode_image(small_jpeg, 48, resize)
    b = decode_image(bytes(small_jpeg), 48, resize)
    assert a.pixels.dtype == np.uint8
    assert a.pixels.shape == (48, 48, 3)
    assert a.pixels.flags["C_CONTIGUOUS"]
    np.testing.assert_array_equal(a.pixels, b.pixels)
    assert (a.width, a.height) == (b.width, b.height) == (160, 120)


def test_decode_file_matches_decode_image(tmp_path, small_jpeg):
    path = tmp_path / "x.jpg"
    path.write_bytes(small_jpeg)
    a = decode_file(str(path), 40, "pad")
    b = decode_image(small_jpeg, 40, "pad")
    np.testing.assert_array_equal(a.pixels, b.pixels)
    assert (a.width, a.height) == (160, 120)


def test_probe_image_accepts_open_file(tmp_path, small_jpeg):
    path = tmp_path / "x.jpg"
    path.write_bytes(small_jpeg)
    with open(path, "rb") as f:
        assert probe_image(f) == (160, 120)


# --------------------------------------------------------------------------------------------
# errors


def test_empty_bytes():
    with pytest.raises(DecodeError, match="empty"):
        decode_image(b"", 32)
    with pytest.raises(DecodeError, match="empty"):
        probe_image(b"")


@pytest.mark.parametrize(
    "data",
    [b"this is a text file, not a JPEG\n" * 4, np.random.default_rng(0).bytes(4096)],
    ids=["text", "random"],
)
def test_not_an_image(data):
    with pytest.raises(DecodeError, match="not an image"):
        decode_image(data, 32)
    with pytest.raises(DecodeError, match="not an image"):
        probe_image(data)


@pytest.mark.parametrize("fraction", [0.5, 0.9])
@pytest.mark.parametrize("draft", [True, False])
def test_truncated_jpeg(small_jpeg, fraction, draft):
    cut = small_jpeg[: int(len(small_jpeg) * fraction)]
    assert probe_image(cut) == (160, 120)  # the header is intact...
    with pytest.raises(DecodeError, match="truncated"):  # ...the pixels are not
        decode_image(cut, 32, settings=DecodeSettings(draft=draft))


def test_truncated_png():
    arr = np.random.default_rng(1).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    raw = encode(Image.fromarray(arr), "PNG")
    with pytest.raises(DecodeError, match="truncated"):
        decode_image(raw[: len(raw) // 2], 32)


def test_decompression_bomb_guard(small_jpeg):
    settings = DecodeSettings(max_pixels=160 * 120 - 1)
    with pytest.raises(DecodeError, match="decompression bomb.*160x120"):
        decode_image(small_jpeg, 32, settings=settings)
    with pytest.raises(DecodeError, match="decompression bomb"):
        probe_image(small_jpeg, settings)
    # exactly at the limit is allowed
    assert probe_image(small_jpeg, DecodeSettings(max_pixels=160 * 120)) == (160, 120)
    decode_image(small_jpeg, 32, settings=DecodeSettings(max_pixels=160 * 120))


def test_decompression_bomb_header_only():
    bomb = png_header_only(20_000, 20_000)  # 400 MP > default max_pixels; 60 bytes of file
    with pytest.raises(DecodeError, match="decompression bomb"):
        probe_image(bomb)
    with pytest.raises(DecodeError, match="decompression bomb"):
        decode_image(bomb, 32)


def test_max_pixels_setting_governs_not_pillow_default():
    header = png_header_only(15_000, 15_000)  # 225 MP < default max_pixels 256 MP
    assert DecodeSettings().max_pixels > 225_000_000
    assert probe_image(header) == (15_000, 15_000)


def test_invalid_resize_mode(small_jpeg):
    with pytest.raises(OptionError, match="center-crop, squash, pad") as e:
        decode_image(small_jpeg, 32, "fit")
    assert "'fit'" in str(e.value)


def test_decode_file_missing_path(tmp_path):
    missing = tmp_path / "nope" / "missing.jpg"
    with pytest.raises(DecodeError, match="missing.jpg") as e:
        decode_file(str(missing), 32)
    assert str(missing) in str(e.value)


# --------------------------------------------------------------------------------------------
# several sizes from one decode: decode_sizes must equal decode_image at every size


def _phone_photo(width: int, height: int, seed: int, orientation: int = 1, **kw) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return jpeg_bytes(photo_like(width, height, seed), quality=92, exif=exif.tobytes(), **kw)


@pytest.fixture(scope="module")
def photos() -> dict[str, bytes]:
    """12 MP-ish phone photos of several sizes, aspects, EXIF orientations and JPEG flavours, and PNGs."""
    rgba = photo_like(1600, 1200, 41).convert("RGBA")
    rgba.putalpha(Image.linear_gradient("L").resize((1600, 1200)))
    return {
        "4032x3024": _phone_photo(4032, 3024, 31),
        "3024x4032 rot180": _phone_photo(3024, 4032, 32, orientation=3),
        "4000x2250 rot90 (16:9)": _phone_photo(4000, 2250, 33, orientation=6),
        "3000x3000 transverse": _phone_photo(3000, 3000, 34, orientation=7),
        "4608x3456 progressive mirrored": _phone_photo(4608, 3456, 35, orientation=2, progressive=True),
        "4032x3024 4:4:4": _phone_photo(4032, 3024, 36, orientation=8, subsampling=0),
        "2592x1944 grey": jpeg_bytes(photo_like(2592, 1944, 37).convert("L"), quality=90),
        "1600x1200 png": encode(photo_like(1600, 1200, 38), "PNG"),
        "1600x1200 png rgba": encode(rgba, "PNG"),
    }


SIZES = (8, 224, 300, 384, 1000)  # 12 MP center-crop: 1/8, 1/8, 1/8, 1/4 and 1/2 draft scales
_OTHER_MODES_ON = ("3024x4032 rot180", "4000x2250 rot90 (16:9)", "1600x1200 png rgba")


@pytest.mark.parametrize("resize", RESIZE_MODES)
def test_decode_sizes_equals_decode_image_at_every_size(photos, resize):
    """The differential test of the multi-size decode: every photo under the default resize mode,
    three of them (portrait, 16:9 rotated, PNG with alpha) under the others."""
    for name, data in photos.items():
        if resize != "center-crop" and name not in _OTHER_MODES_ON:
            continue
        got, decodes = decode_sizes(data, SIZES, resize)
        assert sorted(got) == sorted(SIZES)
        for size in SIZES:
            ref = decode_image(data, size, resize)
            assert isinstance(got[size], Decoded), (name, size, got[size])
            np.testing.assert_array_equal(got[size].pixels, ref.pixels, err_msg=f"{name} at {size}, {resize}")
            assert (got[size].width, got[size].height) == (ref.width, ref.height)
        # one decode per distinct JPEG draft scale; any other format is decoded once
        assert decodes == (1 if "png" in name else len({_draft_scale(data, s, resize) for s in SIZES}))


def _draft_scale(data: bytes, size: int, resize: str) -> int:
    """The DCT scale decode_image's draft request gets from libjpeg (1, 2, 4 or 8)."""
    im = Image.open(io.BytesIO(data))
    full = im.size
    w, h = probe_image(data)
    sx, sy = (
        (size / w, size / h)
        if resize == "squash"
        else ((size / min(w, h),) * 2 if resize == "center-crop" else (size / max(w, h),) * 2)
    )
    need = (max(1, int(np.ceil(w * sx))), max(1, int(np.ceil(h * sy))))
    if full != (w, h):  # EXIF-transposed: the request is in stored orientation
        need = need[::-1]
    im.draft(im.mode, need)
    return full[0] // im.size[0] if im.size[0] else 1


def test_a_coarser_draft_is_not_a_reduced_finer_one(photos):
    """Why decode_sizes decodes again per draft scale: libjpeg's 1/8 scale is not 1/4 then halved."""
    data = photos["4032x3024"]
    coarse, fine = Image.open(io.BytesIO(data)), Image.open(io.BytesIO(data))
    coarse.draft("RGB", (504, 378))
    fine.draft("RGB", (1008, 756))
    assert coarse.size == (504, 378) and fine.size == (1008, 756)
    a, b = np.asarray(coarse.convert("RGB")), np.asarray(fine.convert("RGB").reduce(2))
    assert a.shape == b.shape and not np.array_equal(a, b)
    assert decode_sizes(data, (224, 384))[1] == 2  # 224 drafts to 1/8, 384 to 1/4
    assert decode_sizes(data, (384, 512))[1] == 1  # both draft to 1/4: one decode


def test_decode_sizes_shares_no_failure_it_would_not_have(small_jpeg):
    cut = small_jpeg[: len(small_jpeg) // 2]
    got, _ = decode_sizes(cut, (16, 48))
    for size in (16, 48):
        with pytest.raises(DecodeError) as ref:
            decode_image(cut, size)
        assert isinstance(got[size], DecodeError) and str(got[size]) == str(ref.value)
    with pytest.raises(DecodeError, match="not an image"):
        decode_sizes(b"not an image at all" * 10, (16, 48))
    with pytest.raises(OptionError, match="resize"):
        decode_sizes(small_jpeg, (16,), "fit")


# --------------------------------------------------------------------------------------------
# pixel ranges (issue 22, row 3) and colour (row 13): FORMAT.md, "Pixel values and colour"

ICC_DIR = Path(__file__).parent / "icc"


def png_with_sbit(arr: np.ndarray, bits: int) -> bytes:
    """A 16-bit grey PNG of ``arr`` (written by PIL) with an ``sBIT`` chunk stating ``bits``, after IHDR."""
    raw = encode(Image.fromarray(arr.astype(np.uint16)), "PNG")
    ihdr_end = 8 + 12 + struct.unpack(">I", raw[8:12])[0]
    body = b"sBIT" + bytes([bits])
    chunk = struct.pack(">I", 1) + body + struct.pack(">I", zlib.crc32(body))
    return raw[:ihdr_end] + chunk + raw[ihdr_end:]


def test_a_16_bit_png_of_12_bit_data_with_sbit_comes_out_full_range():
    arr = np.full((32, 64), 4095, dtype=np.uint16)
    arr[:, 32:] = 2048
    raw = png_with_sbit(arr, 12)
    assert Image.open(io.BytesIO(raw)).mode == "I;16"
    left, right = left_right(decode_image(raw, 32, "squash").pixels)
    assert_colour(left, (255, 255, 255))  # 4095 >> 4: the top 8 of 12 significant bits
    assert_colour(right, (128, 128, 128))  # 2048 >> 4


def test_sbit_that_the_values_exceed_is_the_spec_s_left_shifted_data():
    arr = np.full((32, 64), 4095 << 4, dtype=np.uint16)  # what the PNG spec says a 12-bit writer stores
    arr[:, 32:] = 2048 << 4
    left, right = left_right(decode_image(png_with_sbit(arr, 12), 32, "squash").pixels)
    assert_colour(left, (255, 255, 255))
    assert_colour(right, (128, 128, 128))


def test_mode_I_tiff_with_values_0_to_255_is_taken_as_8_bit():
    arr = np.full((32, 64), 200, dtype=np.int32)
    arr[:, 32:] = 7
    raw = encode(Image.fromarray(arr), "TIFF")
    assert Image.open(io.BytesIO(raw)).mode == "I"
    left, right = left_right(decode_image(raw, 32, "squash").pixels)
    assert_colour(left, (200, 200, 200))  # not 200 >> 8 == 0
    assert_colour(right, (7, 7, 7))


def test_mode_I_with_values_past_16_bits_keeps_the_top_8_of_24():
    arr = np.full((32, 64), 0xABCDEF, dtype=np.int32)
    arr[:, 32:] = -5  # negative: 0
    left, right = left_right(decode_image(encode(Image.fromarray(arr), "TIFF"), 32, "squash").pixels)
    assert_colour(left, (0xAB, 0xAB, 0xAB))
    assert_colour(right, BLACK)


def test_float_image_within_0_1_is_scaled_to_0_255():
    arr = np.full((32, 64), 1.0, dtype=np.float32)
    arr[:, 32:] = 0.5
    left, right = left_right(decode_image(encode(Image.fromarray(arr, "F"), "TIFF"), 32, "squash").pixels)
    assert_colour(left, WHITE)
    assert_colour(right, (128, 128, 128))  # round(127.5)


def _adobe() -> bytes:
    return (ICC_DIR / "AdobeRGB1998.icc").read_bytes()


def _srgb_by_hand(im: Image.Image, icc: bytes) -> np.ndarray:
    """The reference: ImageCms applied by hand, profile -> sRGB, perceptual intent."""
    from PIL import ImageCms

    src = ImageCms.ImageCmsProfile(io.BytesIO(icc))
    out = ImageCms.profileToProfile(
        im, src, ImageCms.createProfile("sRGB"), outputMode="RGB", renderingIntent=ImageCms.Intent.PERCEPTUAL
    )
    return np.asarray(out)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_an_embedded_icc_profile_is_converted_to_srgb(fmt):
    kw = {"quality": 95} if fmt == "JPEG" else {}
    raw = encode(photo_like(48, 48, seed=5), fmt, icc_profile=_adobe(), **kw)
    opened = Image.open(io.BytesIO(raw))
    assert opened.info["icc_profile"] == _adobe()
    want = _srgb_by_hand(opened.convert("RGB"), _adobe())
    got = decode_image(raw, 48, "squash").pixels  # 48 -> 48: no resampling
    np.testing.assert_array_equal(got, want)
    stored = np.asarray(Image.open(io.BytesIO(raw)).convert("RGB"))
    assert np.abs(got.astype(int) - stored).max() > 10  # Adobe RGB is not sRGB: the conversion shows
    raw_kept = decode_image(raw, 48, "squash", DecodeSettings(colour="raw")).pixels
    np.testing.assert_array_equal(raw_kept, stored)


def test_an_srgb_profile_is_not_converted():
    from PIL import ImageCms

    srgb = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    im = photo_like(32, 32, seed=6)
    got = decode_image(encode(im, "PNG", icc_profile=srgb), 32, "squash").pixels
    np.testing.assert_array_equal(got, np.asarray(im.convert("RGB")))


def test_a_broken_icc_profile_fails_the_image_naming_the_option():
    raw = encode(photo_like(16, 16, seed=1), "PNG", icc_profile=b"not a profile at all")
    with pytest.raises(DecodeError, match="ICC colour profile cannot be read.*--colour raw"):
        decode_image(raw, 16, "squash")
    assert decode_image(raw, 16, "squash", DecodeSettings(colour="raw")).pixels.shape == (16, 16, 3)


def test_colour_setting_is_checked_and_recorded():
    with pytest.raises(OptionError, match="--colour must be one of srgb, raw"):
        DecodeSettings(colour="p3")
    assert DecodeSettings().to_dict()["colour"] == "srgb"


def test_a_signal_that_surfaces_as_a_decode_error_still_stops_the_command(monkeypatch):
    """A SIGINT raised inside PIL's load, whose clean-up then fails (ValueError with the signal as its
    context), must not be recorded as one more corrupt file while the conversion carries on."""
    import signal as signal_mod

    from wds_tools.signals import Interrupted

    buf = io.BytesIO()
    Image.new("RGB", (64, 48), (10, 200, 30)).save(buf, "JPEG")
    data = buf.getvalue()
    assert decode_image(data, 32).pixels.shape == (32, 32, 3)

    def load_interrupted(self):
        try:
            raise Interrupted(signal_mod.SIGINT)
        finally:
            raise ValueError("a clean-up that failed on the way out")

    monkeypatch.setattr(Image.Image, "load", load_interrupted)
    with pytest.raises(Interrupted):
        decode_image(data, 32)

    def load_broken(self):
        raise ValueError("broken chunk")

    monkeypatch.setattr(Image.Image, "load", load_broken)
    with pytest.raises(DecodeError, match="broken chunk"):  # a plain error is still a bad file
        decode_image(data, 32)


# --- TIFFs that Pillow cannot decode are named by their layout (issue 32, point 9) ---


def baseline_tiff(arr: np.ndarray, sample_format: int, byteorder: str = "<") -> bytes:
    """An uncompressed one-strip TIFF of ``arr`` ([H, W, C], samples interleaved), written by hand from
    the TIFF 6.0 tags, with SampleFormat ``sample_format`` (3: IEEE floating point)."""
    h, w, c = arr.shape
    data = arr.astype(arr.dtype.newbyteorder(byteorder)).tobytes()
    bits = arr.dtype.itemsize * 8
    ifd_end = 8 + 2 + 11 * 12 + 4
    bps_at, sf_at = ifd_end, ifd_end + 2 * c  # three or more SHORTs: after the IFD, then the pixels
    data_at = ifd_end + (4 * c if c > 2 else 0)
    tags = [
        (256, 3, 1, w),
        (257, 3, 1, h),
        (258, 3, c, bps_at if c > 2 else None),
        (259, 3, 1, 1),  # no compression
        (262, 3, 1, 2 if c == 3 else 1),  # RGB or min-is-black
        (273, 4, 1, data_at),
        (277, 3, 1, c),
        (278, 3, 1, h),
        (279, 4, 1, len(data)),
        (284, 3, 1, 1),  # chunky
        (339, 3, c, sf_at if c > 2 else None),
    ]
    out = (b"II*\x00" if byteorder == "<" else b"MM\x00*") + struct.pack(byteorder + "I", 8)
    out += struct.pack(byteorder + "H", len(tags))
    for tag, kind, count, value in tags:
        if value is None:  # one or two SHORTs, inline
            inline = [bits] * count if tag == 258 else [sample_format] * count
            out += struct.pack(byteorder + "HHI", tag, kind, count) + struct.pack(
                byteorder + "HH", *(inline + [0] * (2 - count))
            )
        elif kind == 3 and count == 1:
            out += struct.pack(byteorder + "HHIHH", tag, kind, count, value, 0)
        else:
            out += struct.pack(byteorder + "HHII", tag, kind, count, value)
    out += struct.pack(byteorder + "I", 0)
    if c > 2:
        out += struct.pack(byteorder + "H" * c, *[bits] * c) + struct.pack(byteorder + "H" * c, *[sample_format] * c)
    return out + data


@pytest.mark.parametrize("byteorder", ["<", ">"])
def test_a_float32_rgb_tiff_fails_as_an_unsupported_tiff_sample_format(byteorder):
    raw = baseline_tiff(np.full((8, 10, 3), 0.5, np.float32), 3, byteorder)
    with pytest.raises(Image.UnidentifiedImageError):  # the reason: Pillow reads no float TIFF of 3 samples
        Image.open(io.BytesIO(raw))
    message = (
        r"unsupported TIFF sample format: 3 samples per pixel of 32-bit floating point \(SampleFormat 3, 3, 3, "
        r"BitsPerSample 32, 32, 32, PhotometricInterpretation 2\)"
    )
    for call in (lambda: probe_image(raw), lambda: decode_image(raw, 8)):
        with pytest.raises(DecodeError, match=message):
            call()


def test_another_sample_layout_pillow_lacks_is_named_without_the_float_note():
    raw = baseline_tiff(np.full((8, 10, 2), 7, np.uint8), 1)  # grey and a sample no ExtraSamples explains
    with pytest.raises(DecodeError, match=r"2 samples per pixel of 8-bit unsigned integer \(SampleFormat 1, 1, ") as e:
        decode_image(raw, 8)
    assert "floating-point" not in str(e.value)


def test_the_hand_written_tiff_is_one_pillow_reads_where_it_has_one_float_sample():
    arr = np.full((8, 10, 1), 0.5, np.float32)  # the same writer, one sample: Pillow's mode F, by the float rule
    assert Image.open(io.BytesIO(baseline_tiff(arr, 3))).mode == "F"
    assert_colour(decode_image(baseline_tiff(arr, 3), 8, "squash").pixels, (128, 128, 128))


def test_a_float32_rgb_tiff_in_a_folder_is_listed_in_errors_jsonl_with_its_path(tmp_path):
    import json

    from wds_tools.convert import convert

    (tmp_path / "photos" / "cat").mkdir(parents=True)
    (tmp_path / "photos" / "cat" / "hdr.tif").write_bytes(baseline_tiff(np.full((8, 10, 3), 0.5, np.float32), 3))
    Image.new("RGB", (10, 8), RED).save(tmp_path / "photos" / "cat" / "ok.png")
    res = convert(
        tmp_path / "photos",
        version="v1",
        size=8,
        out=tmp_path / "o",
        workers=1,
        progress=False,
        max_errors="1",
        val_fraction=0.0,
    )
    (entry,) = [json.loads(line) for line in open(res.errors_file)]
    assert entry["path"] == "cat/hdr.tif" and entry["stage"] == "scan"
    assert entry["error"].startswith("unsupported TIFF sample format: 3 samples per pixel of 32-bit floating point")


@pytest.mark.filterwarnings("ignore:Corrupt EXIF data")  # Pillow's, on the cut IFD
def test_a_damaged_tiff_header_is_not_called_an_unknown_format():
    raw = baseline_tiff(np.full((8, 10, 3), 0.5, np.float32), 3)[:40]  # the IFD cut short
    with pytest.raises(DecodeError, match=r"a TIFF file that Pillow cannot read \(its first IFD"):
        decode_image(raw, 8)
