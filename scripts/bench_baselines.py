"""Competing loaders for bench_loader.py: FFCV, litdata and MosaicML streaming, on the same pixels.

Each tool gets a builder that writes the bench's stored samples, ``(key, uint8 [S, S, 3] array,
label)``, in that tool's own format under the bench work folder (cached: built once), and a loader
factory for ``(train, workers, batch)``. Every loader yields ``(images, labels)`` with images
uint8 [B, 3, H, W] (the tools' own cheapest layout: FFCV's ``ToTorchImage`` and the permuted
collated batch of the others are channels-last views) and labels a 1-D tensor.

- eval: stored order, the stored pixels as they are.
- train: random order (each tool's own shuffle), random-resized crop to 224 (scale 0.08-1,
  ratio 3/4-4/3) and a horizontal flip with probability 0.5. FFCV does it in its decoder; litdata
  and streaming per sample in plain torch (bilinear resize, no torchvision).

FFCV has no in-process mode: ``workers=0`` runs it with one worker thread (its workers are threads,
not processes; the main thread only consumes).

Install (see docs/guide/figures.md): apt-get install -y libturbojpeg0-dev libopencv-dev pkg-config, then
pip install -c constraints.txt -e '.[bench-ffcv,bench-litdata,bench-streaming]' and
pip install -c constraints.txt --no-deps litdata==0.2.76 mosaicml-streaming==0.13.0.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import shutil
import sys
import traceback
import types
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

__all__ = [
    "TOOLS",
    "INSTALL",
    "missing",
    "build_ffcv",
    "ffcv_loader",
    "build_litdata",
    "litdata_loader",
    "build_mds",
    "mds_loader",
    "random_resized_crop_flip",
]

Sample = tuple[str, np.ndarray, int]

TOOLS = {"ffcv": "ffcv", "litdata": "litdata", "streaming": "streaming"}  # tool -> module it imports
INSTALL = {
    "ffcv": "apt-get install -y libturbojpeg0-dev libopencv-dev pkg-config && "
    "pip install -c constraints.txt -e '.[bench-ffcv]'",
    "litdata": "pip install -c constraints.txt -e '.[bench-litdata]' && "
    "pip install -c constraints.txt --no-deps litdata==0.2.76",
    "streaming": "pip install -c constraints.txt -e '.[bench-streaming]' && "
    "pip install -c constraints.txt --no-deps mosaicml-streaming==0.13.0",
}
CROP = 224
SCALE = (0.08, 1.0)
RATIO = (3 / 4, 4 / 3)


def missing(tool: str) -> str | None:
    """None when ``tool`` imports, else why not (one line)."""
    try:
        if tool == "streaming":
            _import_streaming()
        else:
            importlib.import_module(TOOLS[tool])
    except Exception as e:  # noqa: BLE001 - any failure to import means: skip this baseline
        return f"{type(e).__name__}: {e}".splitlines()[0]
    return None


def _done(path: Path) -> bool:
    return (path.parent / (path.name + ".done")).exists()


def _mark_done(path: Path) -> None:
    (path.parent / (path.name + ".done")).write_text("ok")


# --- per-sample train transform for litdata and streaming -----------------------------------------
def _crop_box(h: int, w: int, rng: np.random.Generator) -> tuple[int, int, int, int]:
    """(top, left, height, width) as torchvision's RandomResizedCrop.get_params picks them."""
    area = h * w
    log_ratio = (math.log(RATIO[0]), math.log(RATIO[1]))
    for _ in range(10):
        target = area * rng.uniform(*SCALE)
        ratio = math.exp(rng.uniform(*log_ratio))
        cw, ch = round(math.sqrt(target * ratio)), round(math.sqrt(target / ratio))
        if 0 < cw <= w and 0 < ch <= h:
            return int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1)), ch, cw
    in_ratio = w / h  # fallback: centre crop
    if in_ratio < RATIO[0]:
        cw, ch = w, round(w / RATIO[0])
    elif in_ratio > RATIO[1]:
        ch, cw = h, round(h * RATIO[1])
    else:
        cw, ch = w, h
    return (h - ch) // 2, (w - cw) // 2, ch, cw


def random_resized_crop_flip(hwc: np.ndarray, rng: np.random.Generator, size: int = CROP) -> torch.Tensor:
    """uint8 [H, W, 3] -> uint8 [3, size, size]: random-resized crop, bilinear, then a 50% horizontal flip."""
    top, left, ch, cw = _crop_box(hwc.shape[0], hwc.shape[1], rng)
    crop = torch.from_numpy(hwc[top : top + ch, left : left + cw]).permute(2, 0, 1)[None]
    out = F.interpolate(crop, size=(size, size), mode="bilinear", align_corners=False, antialias=False)[0]
    return out.flip(-1) if rng.random() < 0.5 else out


def _hwc_batch(batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Collated eval batch (uint8 [B, H, W, 3]) -> the [B, 3, H, W] view, no copy."""
    return batch["image"].permute(0, 3, 1, 2), batch["label"]


def _chw_batch(batch) -> tuple[torch.Tensor, torch.Tensor]:
    return batch["image"], batch["label"]


# --- FFCV -----------------------------------------------------------------------------------------
class _Indexed:
    """The samples as FFCV's writer reads them: ds[i] -> (image, label)."""

    def __init__(self, samples: Sequence[Sample]):
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        _, arr, label = self.samples[i]
        return arr, label


def build_ffcv(work: Path, samples: Sequence[Sample], *, workers: int = 1) -> Path:
    """``work/ffcv.beton``: RGBImageField in raw mode (stored pixels, no JPEG) and an IntField label."""
    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter

    path = work / "ffcv.beton"
    if _done(path):
        return path
    tmp = path.with_suffix(".tmp")
    fields = {"image": RGBImageField(write_mode="raw"), "label": IntField()}
    DatasetWriter(str(tmp), fields, num_workers=max(1, workers)).from_indexed_dataset(_Indexed(samples))
    tmp.replace(path)
    _mark_done(path)
    return path


def ffcv_loader(path: Path, *, train: bool, workers: int, batch: int):
    """FFCV Loader, os_cache=True; eval: sequential, SimpleRGBImageDecoder; train: random order,
    RandomResizedCropRGBImageDecoder((224, 224)) + RandomHorizontalFlip. ``workers`` 0 runs as 1."""
    from ffcv.fields.decoders import IntDecoder, RandomResizedCropRGBImageDecoder, SimpleRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import RandomHorizontalFlip, Squeeze, ToTensor, ToTorchImage

    if train:
        image = [RandomResizedCropRGBImageDecoder((CROP, CROP), scale=SCALE, ratio=RATIO), RandomHorizontalFlip()]
    else:
        image = [SimpleRGBImageDecoder()]
    image += [ToTensor(), ToTorchImage()]  # uint8, channels-last view; no normalisation
    _quiet_numba_finalizer()
    threads = torch.get_num_threads()
    loader = Loader(
        str(path),
        batch_size=batch,
        num_workers=max(1, workers),
        os_cache=True,
        drop_last=False,
        order=OrderOption.RANDOM if train else OrderOption.SEQUENTIAL,
        pipelines={"image": image, "label": [IntDecoder(), ToTensor(), Squeeze(-1)]},
    )
    torch.set_num_threads(threads)
    return _TorchThreads(loader, threads)


class _TorchThreads:
    """FFCV sets torch's thread count to its ``num_workers`` (``Compiler.set_num_threads``) when a
    Loader is made and when its worker thread starts an epoch; put the caller's back once that
    thread has started (at the first batch), so that the consumer runs as in every other row."""

    def __init__(self, loader, threads: int):
        self.loader, self.threads = loader, threads

    def __iter__(self):
        it = iter(self.loader)
        for b in it:
            torch.set_num_threads(self.threads)
            yield b
            break
        yield from it


def _quiet_numba_finalizer() -> None:
    """Drop one harmless message: when the pipeline functions FFCV compiles for a train Loader
    are collected, numba's dispatcher finalizer (numba 0.64 to 0.68) raises ``KeyError`` on an
    ``imdecode`` signature with literal arguments and Python prints "Exception ignored in ..."."""
    if getattr(sys.unraisablehook, "_bench_baselines", False):
        return
    previous = sys.unraisablehook

    def hook(unraisable):
        frames = traceback.extract_tb(unraisable.exc_traceback) if unraisable.exc_traceback else []
        if (
            isinstance(unraisable.exc_value, KeyError)
            and frames
            and frames[-1].name == "finalizer"
            and frames[-1].filename.replace("\\", "/").endswith("numba/core/dispatcher.py")
        ):
            return
        previous(unraisable)

    hook._bench_baselines = True
    sys.unraisablehook = hook


# --- litdata --------------------------------------------------------------------------------------
_LITDATA_SAMPLES: Sequence[Sample] = ()


def _litdata_item(i: int) -> dict:
    _, arr, label = _LITDATA_SAMPLES[i]
    return {"image": arr, "label": int(label)}


def build_litdata(work: Path, samples: Sequence[Sample], *, workers: int = 1) -> Path:
    """``work/litdata/``: ``litdata.optimize`` of {"image": uint8 array, "label": int}, 64 MB chunks."""
    import litdata

    global _LITDATA_SAMPLES
    path = work / "litdata"
    if _done(path):
        return path
    shutil.rmtree(path, ignore_errors=True)
    _LITDATA_SAMPLES = samples  # read by the forked optimize workers, never pickled
    try:
        litdata.optimize(
            fn=_litdata_item,
            inputs=list(range(len(samples))),
            output_dir=str(path),
            chunk_bytes="64MB",
            num_workers=max(1, workers),
            start_method="fork",
            keep_data_ordered=True,
            verbose=False,
        )
    finally:
        _LITDATA_SAMPLES = ()
    _mark_done(path)
    return path


class _LitdataTrain:
    """litdata transform: random-resized crop + flip per sample (its own generator per worker)."""

    def __init__(self) -> None:
        self.rng: np.random.Generator | None = None

    def __call__(self, item: dict) -> dict:
        if self.rng is None:
            self.rng = np.random.default_rng()
        return {"image": random_resized_crop_flip(item["image"], self.rng), "label": item["label"]}


def litdata_loader(path: Path, *, train: bool, workers: int, batch: int):
    """StreamingDataset (local folder) + StreamingDataLoader; train: shuffle=True + crop/flip transform.

    ``batch_decode=0`` (one item at a time): its default ("auto") decodes windows of 256 items for
    numpy items, and with shuffle=True it decodes a window again for nearly every item it serves
    (about 60 array copies per sample here, 6x slower); per item is its fastest setting for both modes.
    """
    from litdata import StreamingDataLoader, StreamingDataset

    ds = StreamingDataset(
        str(path), shuffle=train, drop_last=False, batch_decode=0, transform=_LitdataTrain() if train else None
    )
    loader = StreamingDataLoader(ds, batch_size=batch, num_workers=workers)
    return _Mapped(loader, _chw_batch if train else _hwc_batch)


# --- MosaicML streaming ---------------------------------------------------------------------------
def _import_streaming():
    """``import streaming`` (mosaicml-streaming 0.13.0).

    Its package ``__init__`` imports its vision and text datasets, so torchvision and transformers
    too, though the MDS reader and writer use neither. PyPI's torchvision is a CUDA build that does
    not import beside the CPU torch (``operator torchvision::nms does not exist``), so whichever of
    the two does not import is replaced by an inert stand-in for the import alone, then removed.
    """
    if "streaming" in sys.modules:
        return sys.modules["streaming"]
    if importlib.util.find_spec("streaming") is None:
        raise ImportError("No module named 'streaming'")
    stand_ins: dict[str, types.ModuleType] = {}

    def stand_in(name: str, **attrs) -> None:
        mod = types.ModuleType(name)
        mod.__dict__.update(attrs)
        stand_ins[name] = mod

    for pkg, probe in (
        ("torchvision", "torchvision.datasets"),
        ("transformers", "transformers.tokenization_utils_base"),
    ):
        try:
            importlib.import_module(probe)
        except Exception:  # noqa: BLE001 - missing, or installed and broken
            for name in [m for m in sys.modules if m == pkg or m.startswith(pkg + ".")]:
                del sys.modules[name]
            if pkg == "torchvision":
                stand_in("torchvision")
                stand_in("torchvision.datasets", VisionDataset=type("VisionDataset", (), {}))
                stand_in("torchvision.transforms")
                stand_in("torchvision.transforms.functional", to_tensor=None)
            else:
                stand_in("transformers")
                stand_in("transformers.feature_extraction_utils", BatchFeature=type("BatchFeature", (dict,), {}))
                stand_in("transformers.tokenization_utils_base", BatchEncoding=type("BatchEncoding", (dict,), {}))
                stand_in("transformers.models")
                stand_in("transformers.models.auto")
                stand_in("transformers.models.auto.tokenization_auto", AutoTokenizer=None)
    sys.modules.update(stand_ins)
    try:
        return importlib.import_module("streaming")
    finally:
        for name in stand_ins:
            sys.modules.pop(name, None)


def build_mds(work: Path, samples: Sequence[Sample], *, workers: int = 1) -> Path:
    """``work/mds/``: MDSWriter with an ``ndarray:uint8:S,S,3`` image column and an ``int`` label, 64 MB shards."""
    streaming = _import_streaming()

    path = work / "mds"
    if _done(path):
        return path
    shutil.rmtree(path, ignore_errors=True)
    h, w, c = samples[0][1].shape
    columns = {"image": f"ndarray:uint8:{h},{w},{c}", "label": "int"}
    with streaming.MDSWriter(out=str(path), columns=columns, size_limit=64 << 20, progress_bar=False) as out:
        for _, arr, label in samples:
            out.write({"image": arr, "label": int(label)})
    _mark_done(path)
    return path


def mds_loader(path: Path, *, train: bool, workers: int, batch: int):
    """StreamingDataset(local=...) + torch DataLoader; train: shuffle=True + crop/flip per sample."""
    streaming = _import_streaming()

    class MDSDataset(streaming.StreamingDataset):
        rng: np.random.Generator | None = None

        def __getitem__(self, i):
            item = super().__getitem__(i)
            if not train:
                return item
            if self.rng is None:
                self.rng = np.random.default_rng()
            return {"image": random_resized_crop_flip(item["image"], self.rng), "label": item["label"]}

    # a previous loader's shared memory (same local folder) is only freed once it is collected
    streaming.base.util.clean_stale_shared_memory()
    ds = MDSDataset(local=str(path), shuffle=train, batch_size=batch)
    loader = torch.utils.data.DataLoader(ds, batch_size=batch, num_workers=workers)
    return _Mapped(loader, _chw_batch if train else _hwc_batch)


class _Mapped:
    """An iterable over ``loader`` that hands each batch through ``fn`` (dict -> (images, labels))."""

    def __init__(self, loader, fn):
        self.loader, self.fn = loader, fn

    def __iter__(self):
        return map(self.fn, self.loader)
