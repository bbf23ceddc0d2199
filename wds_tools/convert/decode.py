"""The pixels of a sample: source bytes -> uint8 array [size, size, 3].

``decode_image`` is the project's single reference for what a converted sample holds; the
converter, the tests and the incremental re-sharding all call it.
"""

from __future__ import annotations

import functools
import io
import math
import struct
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import BinaryIO

import numpy as np
from PIL import Image, ImageCms, ImageOps

from ..errors import DecodeError, OptionError, install_hint
from ..signals import reraise_interruption

__all__ = [
    "RESIZE_MODES",
    "COLOUR_MODES",
    "DecodeSettings",
    "Decoded",
    "decode_image",
    "decode_sizes",
    "decode_file",
    "probe_image",
    "decoder_versions",
    "recorded_decode",
]

RESIZE_MODES = ("center-crop", "squash", "pad")
"""The values of ``resize``: how a non-square image becomes square."""
COLOUR_MODES = ("srgb", "raw")
"""The values of ``DecodeSettings.colour``: an embedded ICC profile converted to sRGB, or ignored (the raw values)."""

_FILTERS = {
    "lanczos": Image.Resampling.LANCZOS,
    "bicubic": Image.Resampling.BICUBIC,
    "bilinear": Image.Resampling.BILINEAR,
    "box": Image.Resampling.BOX,
}

# EXIF orientations that swap width and height.
_TRANSPOSED_ORIENTATIONS = {5, 6, 7, 8}
_EXIF_ORIENTATION_TAG = 0x0112


@dataclass(frozen=True)
class DecodeSettings:
    """How source bytes become pixels; recorded in the index as ``decode``."""

    draft: bool = True  # JPEG: let libjpeg downscale by 1/2, 1/4 or 1/8 in the DCT domain
    filter: str = "lanczos"  # antialiased resampling filter for the final resize
    alpha_background: tuple[int, int, int] = (255, 255, 255)  # transparent pixels land on this
    pad_fill: tuple[int, int, int] = (0, 0, 0)  # border colour of resize mode "pad"
    max_pixels: int = 256_000_000  # decompression-bomb guard, checked on the header
    colour: str = "srgb"  # an embedded ICC profile: "srgb" converts to sRGB (ImageCms), "raw" ignores it

    def __post_init__(self) -> None:
        if self.filter not in _FILTERS:
            raise OptionError(f"filter must be one of {', '.join(_FILTERS)}, not {self.filter!r}")
        if self.colour not in COLOUR_MODES:
            raise OptionError(f"--colour must be one of {', '.join(COLOUR_MODES)}, not {self.colour!r}")

    def to_dict(self) -> dict:
        """The settings as index.json and run.json record them (tuples as lists)."""
        d = asdict(self)
        d["alpha_background"] = list(self.alpha_background)
        d["pad_fill"] = list(self.pad_fill)
        return d


@dataclass(frozen=True)
class Decoded:
    """One decoded image: its square pixels, and the source's displayed width and height."""

    pixels: np.ndarray  # uint8 [side, side, 3], C order
    width: int  # of the source image as displayed (after EXIF orientation)
    height: int


def recorded_decode(decode: dict | None) -> dict | None:
    """An index's ``decode`` as today's settings word it: one written before ``colour`` existed was
    made ignoring ICC profiles, so it reads as ``"colour": "raw"``."""
    if not isinstance(decode, dict) or "colour" in decode:
        return decode
    return {**decode, "colour": "raw"}


def decoder_versions() -> dict[str, str]:
    """Library versions that can change pixels; recorded in the index for provenance."""
    from PIL import __version__ as pil_version
    from PIL import features

    return {"pillow": pil_version, "libjpeg": str(features.version("jpg"))}


_HEIF_BRANDS = {b"heic", b"heix", b"heim", b"heis", b"hevc", b"hevx", b"mif1", b"msf1", b"mif2"}
_AVIF_BRANDS = {b"avif", b"avis"}
HEIF_EXTRA = install_hint("heif")


def _ftyp_brand(f: BinaryIO) -> bytes | None:
    """An ISO-BMFF file's major brand (``heic``, ``avif``, ...), or None; ``f`` is left at 0."""
    head = f.read(12)
    f.seek(0)
    return head[8:12] if len(head) == 12 and head[4:8] == b"ftyp" else None


@functools.lru_cache(maxsize=1)
def _heif_registered() -> bool:
    """Register pillow-heif's HEIC/HEIF opener with Pillow (once); False when the extra is missing."""
    try:
        import pillow_heif  # the 'heif' extra: heavy, so imported only when a HEIC/HEIF file turns up
    except ImportError:
        return False
    pillow_heif.register_heif_opener()
    return True


def _open(data: bytes | BinaryIO, settings: DecodeSettings) -> Image.Image:
    if isinstance(data, (bytes, bytearray, memoryview)):
        if not data:
            raise DecodeError("empty file")
        data = io.BytesIO(data)
    try:
        return _open_pillow(data, settings)
    except _Unidentified:
        brand = _ftyp_brand(data)
        if brand in _HEIF_BRANDS:
            if not _heif_registered():
                raise DecodeError(
                    f"a HEIC/HEIF image (a phone photo): converting it needs the 'heif' extra: {HEIF_EXTRA}"
                ) from None
            try:
                return _open_pillow(data, settings)
            except _Unidentified:
                pass
        if brand in _AVIF_BRANDS:
            raise DecodeError(
                "an AVIF image, and this Pillow has no AVIF codec: install Pillow 11.3 or newer "
                "from its wheels (pip install -U pillow)"
            ) from None
        tiff = _tiff_layout(data)
        if tiff is not None:
            raise DecodeError(tiff) from None
        raise DecodeError("not an image: the format is not recognised") from None


_SAMPLE_FORMATS = {
    1: "unsigned integer",
    2: "signed integer",
    3: "floating point",
    4: "undefined",
    5: "complex integer",
    6: "complex floating point",
}


def _tiff_layout(f: BinaryIO) -> str | None:
    """Why Pillow could not open a file that starts as a TIFF, from its first IFD's sample tags; None
    when the file is no TIFF. ``f`` is left at 0."""
    try:
        head = f.read(8)
        order = {b"II": "<", b"MM": ">"}.get(head[:2])
        if order is None or len(head) < 8 or struct.unpack(order + "H", head[2:4])[0] != 42:
            return None
        try:
            f.seek(struct.unpack(order + "I", head[4:8])[0])
            (count,) = struct.unpack(order + "H", f.read(2))
            entries = f.read(12 * count)
            if len(entries) < 12 * count:
                raise ValueError("cut short")
            tags = {}
            for i in range(count):
                tag, kind, n, value = struct.unpack(order + "HHI4s", entries[12 * i : 12 * i + 12])
                if tag in (258, 262, 277, 338, 339) and kind == 3:  # SHORTs: inline up to 2, else at an offset
                    if n > 2:
                        f.seek(struct.unpack(order + "I", value)[0])
                        value = f.read(2 * n)
                    tags[tag] = list(struct.unpack(f"{order}{n}H", value[: 2 * n]))
        except (struct.error, ValueError, OSError):
            return (
                "a TIFF file that Pillow cannot read (its first IFD is damaged or cut short); re-save it as "
                "PNG or an 8-bit TIFF"
            )
    finally:
        f.seek(0)
    samples = tags.get(277, [1])[0]
    bits = tags.get(258, [1])
    formats = tags.get(339, [1])
    kinds = sorted({_SAMPLE_FORMATS.get(v, f"SampleFormat {v}") for v in formats})
    width = f"{bits[0]}-bit" if len(set(bits)) == 1 else "/".join(map(str, bits)) + "-bit"
    extra = f", ExtraSamples {', '.join(map(str, tags[338]))}" if 338 in tags else ""
    floats = " (it reads floating-point TIFFs of one sample, grey, only)" if 3 in formats else ""
    return (
        f"unsupported TIFF sample format: {samples} sample{'s' if samples != 1 else ''} per pixel of {width} "
        f"{' and '.join(kinds)} (SampleFormat {', '.join(map(str, formats))}, BitsPerSample "
        f"{', '.join(map(str, bits))}, PhotometricInterpretation {tags.get(262, ['?'])[0]}{extra}): Pillow, "
        f"which decodes TIFFs here, has no mode for this combination{floats}. Save the image as 8- or 16-bit "
        "integer RGB (or grey), and convert it again"
    )


class _Unidentified(Exception):
    """Pillow knows no opener for the bytes."""


def _open_pillow(data: BinaryIO, settings: DecodeSettings) -> Image.Image:
    # settings.max_pixels is the guard (checked by the callers on the header); Pillow's own,
    # at 2 x Image.MAX_IMAGE_PIXELS, must not refuse images below it.
    pillow_limit = Image.MAX_IMAGE_PIXELS
    if pillow_limit is not None and 2 * pillow_limit < settings.max_pixels:
        Image.MAX_IMAGE_PIXELS = settings.max_pixels
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            return Image.open(data)
    except Image.DecompressionBombError as e:
        raise DecodeError(f"decompression bomb refused: {e}") from None
    except Image.UnidentifiedImageError:
        data.seek(0)
        raise _Unidentified() from None
    except Exception as e:  # SyntaxError, struct.error, ... from a damaged header
        reraise_interruption(e)
        raise DecodeError(f"not an image: {e}") from None
    finally:
        Image.MAX_IMAGE_PIXELS = pillow_limit


def _orientation(im: Image.Image) -> int:
    try:
        value = im.getexif().get(_EXIF_ORIENTATION_TAG, 1)
        return int(value) if int(value) in range(1, 9) else 1
    except Exception as e:  # a broken EXIF block must not lose an otherwise good image
        reraise_interruption(e)
        return 1


def _open_checked(data: bytes | BinaryIO, settings: DecodeSettings) -> tuple[Image.Image, int, int, int]:
    """Open and check the header: (image, orientation, displayed width, displayed height)."""
    im = _open(data, settings)
    w, h = im.size
    if w <= 0 or h <= 0:
        raise DecodeError(f"image has no pixels ({w}x{h})")
    if w * h > settings.max_pixels:
        raise DecodeError(f"decompression bomb refused: {w}x{h} = {w * h} pixels > max_pixels {settings.max_pixels}")
    orientation = _orientation(im)
    if orientation in _TRANSPOSED_ORIENTATIONS:
        w, h = h, w
    return im, orientation, w, h


def probe_image(data: bytes | BinaryIO, settings: DecodeSettings = DecodeSettings()) -> tuple[int, int]:
    """The displayed (width, height) from the header only (of bytes or an open binary file), or ``DecodeError``."""
    _, _, w, h = _open_checked(data, settings)
    return w, h


def _resize_scale(w: int, h: int, side: int, resize: str) -> tuple[float, float]:
    if resize == "squash":
        return side / w, side / h
    s = side / min(w, h) if resize == "center-crop" else side / max(w, h)
    return s, s


def _png_sbit(data: bytes | BinaryIO) -> int | None:
    """The significant bits a PNG's ``sBIT`` chunk states for grey (the largest for colour), or None."""
    head = data[: 1 << 16] if isinstance(data, (bytes, bytearray, memoryview)) else b""
    pos = 8
    while pos + 8 <= len(head):
        length, kind = struct.unpack(">I4s", head[pos : pos + 8])
        if kind == b"sBIT":
            body = head[pos + 8 : pos + 8 + length]
            return max(body) if body else None
        if kind in (b"IDAT", b"IEND"):
            return None
        pos += 12 + length
    return None


def integer_bits(top: int, mode: str, sbit: int | None) -> int:
    """The significant bits of an integer grey image (FORMAT.md, Pixels): ``sbit`` when stated and
    the largest value ``top`` fits in it; else 16 for a 16-bit mode; else (32-bit ``I``, which has no
    depth of its own) the fewest of 8, 16, 24 and 32 bits that hold ``top``."""
    if sbit is not None and 1 <= sbit <= 16 and top < 1 << sbit:
        return sbit
    if mode.startswith("I;16"):
        return 16
    return next(b for b in (8, 16, 24, 32) if top < 1 << b)


def _grey_to_8bit(arr: np.ndarray, mode: str, sbit: int | None) -> np.ndarray:
    """Integer grey -> uint8: the top 8 of its significant bits (negative values are 0)."""
    arr = np.clip(arr.astype(np.int64), 0, None)
    bits = integer_bits(int(arr.max()) if arr.size else 0, mode, sbit)
    return (arr >> (bits - 8) if bits >= 8 else arr << (8 - bits)).astype(np.uint8)


def _float_to_8bit(arr: np.ndarray) -> np.ndarray:
    """Float grey -> uint8: values within [0, 1] are scaled by 255, others taken as 0..255; clipped, rounded."""
    arr = np.nan_to_num(arr.astype(np.float64), nan=0.0, posinf=255.0, neginf=0.0)
    if arr.size and arr.min() >= 0.0 and arr.max() <= 1.0:
        arr = arr * 255.0
    return np.clip(arr, 0, 255).round().astype(np.uint8)


_SRGB = ImageCms.createProfile("sRGB")


@functools.lru_cache(maxsize=32)
def _icc_transform(icc: bytes, mode: str, out_mode: str) -> ImageCms.ImageCmsTransform | None:
    """An lcms transform from the embedded profile to sRGB, or None when the profile says sRGB."""
    try:
        profile = ImageCms.ImageCmsProfile(io.BytesIO(icc))
        if ImageCms.getProfileDescription(profile).strip().lower().startswith("srgb"):
            return None
        return ImageCms.buildTransform(profile, _SRGB, mode, out_mode, renderingIntent=ImageCms.Intent.PERCEPTUAL)
    except (ImageCms.PyCMSError, OSError, ValueError) as e:
        raise DecodeError(
            f"its embedded ICC colour profile cannot be read ({e}); convert with --colour raw "
            "to keep the stored values, or re-save the image without the profile"
        ) from None


_ICC_MODES = {"RGB": "RGB", "RGBA": "RGBA", "CMYK": "RGB", "L": "RGB"}


def _to_srgb(im: Image.Image, icc: bytes | None, settings: DecodeSettings) -> Image.Image:
    """``im`` converted from its embedded ICC profile to sRGB (``settings.colour == "srgb"``)."""
    if not icc or settings.colour != "srgb" or im.mode not in _ICC_MODES:
        return im
    transform = _icc_transform(bytes(icc), im.mode, _ICC_MODES[im.mode])
    return im if transform is None else transform.apply(im)


def _to_rgb(im: Image.Image, settings: DecodeSettings, sbit: int | None = None) -> Image.Image:
    mode = im.mode
    if mode in ("L", "RGB") and "transparency" in im.info:  # PNG tRNS colour key
        im = im.convert("RGBA")
    elif mode == "RGB":
        return im
    if mode.startswith("I;16") or mode == "I":
        # PIL's own convert would clip at 255 instead
        return Image.fromarray(_grey_to_8bit(np.asarray(im), mode, sbit), "L").convert("RGB")
    if mode == "F":
        return Image.fromarray(_float_to_8bit(np.asarray(im)), "L").convert("RGB")
    if mode == "P":
        im = im.convert("RGBA") if "transparency" in im.info else im.convert("RGB")
    elif mode in ("LA", "La", "PA", "RGBa"):
        im = im.convert("RGBA")
    if im.mode == "RGBA":
        background = Image.new("RGB", im.size, settings.alpha_background)
        background.paste(im, mask=im.getchannel("A"))
        return background
    try:
        return im.convert("RGB")
    except ValueError as e:
        raise DecodeError(f"unsupported image mode {mode}: {e}") from None


def decode_image(
    data: bytes,
    size: int,
    resize: str = "center-crop",
    settings: DecodeSettings = DecodeSettings(),
) -> Decoded:
    """Decode image bytes to uint8 RGB pixels of shape [size, size, 3].

    JPEGs are decoded in draft mode (DCT-domain downscale to the smallest power-of-two
    reduction that still covers the final size), then resized with an antialiased filter.
    EXIF orientation is applied; every mode becomes RGB, transparency over
    ``settings.alpha_background``. Raises ``DecodeError`` for anything that is not a readable image.
    """
    if resize not in RESIZE_MODES:
        raise OptionError(f"resize must be one of {', '.join(RESIZE_MODES)}, not {resize!r}")
    im, orientation, w, h = _open_checked(data, settings)
    need = _draft_size(w, h, size, resize, orientation) if settings.draft and im.format == "JPEG" else None
    return Decoded(_resize(_upright_rgb(im, data, orientation, settings, need), size, resize, settings), w, h)


def _draft_size(w: int, h: int, side: int, resize: str, orientation: int) -> tuple[int, int]:
    """The stored (not displayed) size a JPEG draft must still cover for ``side`` after ``resize``."""
    sx, sy = _resize_scale(w, h, side, resize)
    need = (max(1, math.ceil(w * sx)), max(1, math.ceil(h * sy)))
    return (need[1], need[0]) if orientation in _TRANSPOSED_ORIENTATIONS else need


def _corrupt(e: Exception) -> DecodeError:
    """``e`` (truncated data, broken chunks: OSError, SyntaxError, ...) as a ``DecodeError``."""
    reraise_interruption(e)
    return e if isinstance(e, DecodeError) else DecodeError(f"truncated or corrupt image data: {e}")


def _upright_rgb(
    im: Image.Image, data: bytes, orientation: int, settings: DecodeSettings, draft: tuple[int, int] | None = None
) -> Image.Image:
    """``im``'s pixels (first drafted to cover ``draft``, if given) upright and in RGB, to be resized."""
    try:
        if draft is not None:
            im.draft(im.mode, draft)
        im.load()
        icc, sbit = im.info.get("icc_profile"), _sbit_of(im, data)
        if orientation != 1:
            im = ImageOps.exif_transpose(im)
        return _to_rgb(_to_srgb(im, icc, settings), settings, sbit)
    except Exception as e:
        raise _corrupt(e) from None


def decode_sizes(
    data: bytes,
    sizes: Sequence[int],
    resize: str = "center-crop",
    settings: DecodeSettings = DecodeSettings(),
) -> tuple[dict[int, Decoded | DecodeError], int]:
    """``decode_image(data, size, resize, settings)`` for several sizes, from as few decodes as that allows.

    Sizes whose JPEG draft request gives libjpeg the same DCT scale share one decode (so do all
    sizes of any other format, or with ``draft`` off); a size that alone would draft to a smaller
    scale gets its own decode at that scale, because a coarser DCT scale is not the same as
    reducing a finer one (the rounding differs), and each size's pixels must equal its own run's.
    Returns (each size's ``Decoded``, or the ``DecodeError`` its own ``decode_image`` would raise;
    the number of decodes done). A header that cannot be read raises for all of them.
    """
    if resize not in RESIZE_MODES:
        raise OptionError(f"resize must be one of {', '.join(RESIZE_MODES)}, not {resize!r}")
    im, orientation, w, h = _open_checked(data, settings)
    groups: dict[tuple, tuple[Image.Image | DecodeError, list[int]]] = {}
    for side in sorted(set(sizes), reverse=True):
        cand = im
        if settings.draft and im.format == "JPEG":
            # the same calls as decode_image, on a fresh header: draft() can be called once per image
            cand = im if not groups else _open_checked(data, settings)[0]
            try:
                cand.draft(cand.mode, _draft_size(w, h, side, resize, orientation))
            except Exception as e:
                groups[("error", side)] = (_corrupt(e), [side])
                continue
        key = (cand.mode, cand.size)  # PIL's (w, h) after the draft
        if key in groups:
            groups[key][1].append(side)
        else:
            groups[key] = (cand, [side])
    out: dict[int, Decoded | DecodeError] = {}
    for picture, members in groups.values():
        try:
            if isinstance(picture, DecodeError):
                raise picture
            picture = _upright_rgb(picture, data, orientation, settings)
        except DecodeError as e:
            out.update((side, e) for side in members)
            continue
        for side in members:
            out[side] = Decoded(_resize(picture, side, resize, settings), w, h)
    return out, len(groups)


def _sbit_of(im: Image.Image, data: bytes) -> int | None:
    """A 16-bit PNG's ``sBIT`` significant bits (read only for integer grey modes), or None."""
    if im.format != "PNG" or not (im.mode.startswith("I;16") or im.mode == "I"):
        return None
    return _png_sbit(data)


def _resize(im: Image.Image, side: int, resize: str, settings: DecodeSettings) -> np.ndarray:
    resample = _FILTERS[settings.filter]
    w, h = im.size  # may be smaller than the source after draft; proportions are kept
    if resize == "squash":
        out = im.resize((side, side), resample)
    elif resize == "center-crop":
        crop = min(w, h)
        left, top = (w - crop) / 2, (h - crop) / 2
        out = im.resize((side, side), resample, box=(left, top, left + crop, top + crop))
    else:  # pad
        s = side / max(w, h)
        nw, nh = max(1, round(w * s)), max(1, round(h * s))
        out = Image.new("RGB", (side, side), settings.pad_fill)
        out.paste(im.resize((nw, nh), resample), ((side - nw) // 2, (side - nh) // 2))
    arr = np.asarray(out, dtype=np.uint8)
    if arr.shape != (side, side, 3):  # an invariant of the code above, not of the input
        raise AssertionError(f"resize produced {arr.shape}")
    return np.ascontiguousarray(arr)


def decode_file(
    path: str, size: int, resize: str = "center-crop", settings: DecodeSettings = DecodeSettings()
) -> Decoded:
    """``decode_image`` on a file's bytes: the reference pixels of a source file."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise DecodeError(f"cannot read {path}: {e.strerror or e}") from None
    return decode_image(data, size, resize, settings)
