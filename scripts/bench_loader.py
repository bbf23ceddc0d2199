"""Loader throughput: training_adapter against stock webdataset, per-file .npy, HDF5, JPEG shards, raw reads,
and FFCV, litdata and MosaicML streaming when they are installed.

Builds one corpus of photo-like JPEGs, converts it to 224 px shards with wds_tools.convert, writes the
same pixels in each baseline's layout, then times every loader in this one run, with num_workers 0
and with all cores. FFCV, litdata and MosaicML streaming (scripts/bench_baselines.py) are skipped,
with one line saying how to install them, when they do not import; the eval table has their eval
loaders, and a second table compares train mode (random order, random-resized crop + flip).
Rates are samples/s of a loader's second and later epochs (one untimed epoch first, as in a training run),
counted from each epoch's first batch (worker start-up excluded; for our streaming rows with a
shuffle buffer from the iterator's start, so that filling the buffer counts), each batch's
images read once by the consumer (copied into a reused buffer, as a trainer's copy to the GPU
would), median of --repeats runs; the main process uses one torch thread so that "num_workers 0" is the
rate of one process. Everything is read from the page cache (the data fits in memory).

The targets are checked on comparisons timed interleaved (--rounds rounds, each timing every
loader compared once, in turn, so that they share the machine's noise): our eval loader with each
check_samples level against FFCV and ``cat`` of the shard files; a 10% subset against the full
epoch; balanced against plain epochs. Our index reader's workers are threads when they only copy
(eval, device_augment) and processes when they augment on the CPU; FFCV's are always threads.

    .venv/bin/python scripts/bench_loader.py [--samples 8192] [--batch 64] [--rounds 5] [--work /tmp/wds-bench]

``--against TREE`` times, instead, this tree's loader against the one in TREE (a checkout of the
code before a change) in the same run: train with every option at its default and eval, with the
index reader and with the streaming reader (``reader="stream"``), each in its own process per
tree, interleaved rounds (every other one in reverse order), medians and ratios (with
``--workers 0``, per second of the process's CPU time, which other load on the machine disturbs
less than wall time); and this tree's ``transform=`` with a user's torchvision-style crop + flip in plain torch (``UserCropFlip``, ``augment=False``)
against the built-in path with the same workers.

``--main-cpu`` times what the training process itself spends per batch (``time.process_time()`` of
the process that iterates the loader, every thread of it counted: the DataLoader's queues, a pin
thread), batch 256 at 224 px by default, train with every option at its default but
``persistent_workers`` and ``pin_memory`` (each combination), the caller dropping each batch; with
``--against TREE`` that tree's loader in the same interleaved rounds:

    .venv/bin/python scripts/bench_loader.py --main-cpu --batch 256 --against <checkout before> --rounds 7
"""

from __future__ import annotations

import argparse
import io
import statistics
import subprocess
import sys
import tarfile
import time
import uuid
import warnings
from collections.abc import Sequence
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_baselines as extra  # noqa: E402  (scripts/ is on sys.path: this file's folder)

from training_adapter import make_loader  # noqa: E402
from wds_tools.convert import convert  # noqa: E402
from wds_tools.cpus import usable_cpus  # noqa: E402
from wds_tools.synth import jpeg_bytes, photo_like  # noqa: E402

SIZE = 224


# --- data ---------------------------------------------------------------------------------------
def build(work: Path, n: int) -> Path:
    """JPEG corpus -> shards (cached in work/ between runs)."""
    shards = work / "shards" / "v1" / str(SIZE)
    if (shards / "index.json").exists():
        return shards
    src = work / "corpus"
    (src / "img").mkdir(parents=True, exist_ok=True)
    rows = ["key,path,label,split"]
    for i in range(n):
        (src / "img" / f"{i:06d}.jpg").write_bytes(jpeg_bytes(photo_like(300, 300, seed=i), quality=90))
        rows.append(f"k{i:06d},img/{i:06d}.jpg,c{i % 7},train")
    (src / "manifest.csv").write_text("\n".join(rows) + "\n")
    convert(src / "manifest.csv", version="v1", size=SIZE, out=work / "shards", shard_size="64MB", progress=False)
    return shards


def stored_samples(shards: Path):
    for tar in sorted(shards.glob("train-*.tar")):
        with tarfile.open(tar) as tf:
            members = {m.name: m for m in tf}
            for name, m in members.items():
                if name.endswith(".npy"):
                    key = name[:-4]
                    arr = np.load(io.BytesIO(tf.extractfile(m).read()))
                    label = int(tf.extractfile(members[key + ".cls"]).read())
                    yield key, arr, label


def build_baselines(work: Path, shards: Path) -> dict:
    import h5py
    import webdataset as wds

    npy_dir, h5, jpg = work / "npycache", work / "images.h5", work / "jpeg_shards"
    if not (work / "baselines.done").exists():
        samples = list(stored_samples(shards))
        n = len(samples)
        root = npy_dir / "v1" / str(SIZE)
        with h5py.File(h5, "w") as f:
            images = f.create_dataset("images", (n, SIZE, SIZE, 3), dtype="u1")
            labels = f.create_dataset("labels", (n,), dtype="i8")
            for i, (_key, arr, label) in enumerate(samples):
                images[i] = arr
                labels[i] = label
        index = []
        for key, arr, label in samples:  # seed 000's cache: <version>/<size>/<uuid[:2]>/<uuid>.npy
            u = uuid.uuid5(uuid.NAMESPACE_URL, key).hex
            (root / u[:2]).mkdir(parents=True, exist_ok=True)
            np.save(root / u[:2] / f"{u}.npy", arr)
            index.append(f"{u[:2]}/{u}.npy\t{label}")
        (root / "index.tsv").write_text("\n".join(index) + "\n")
        jpg.mkdir(exist_ok=True)
        with wds.ShardWriter(str(jpg / "jpg-%06d.tar"), maxcount=512, verbose=0) as w:
            for key, arr, label in samples:
                w.write(
                    {
                        "__key__": key,
                        "jpg": jpeg_bytes(__import__("PIL.Image").Image.fromarray(arr), quality=90),
                        "cls": str(label).encode(),
                    }
                )
        (work / "baselines.done").write_text("ok")
    return {"npy": npy_dir / "v1" / str(SIZE), "h5": h5, "jpg": sorted(str(p) for p in jpg.glob("*.tar"))}


class StoredSamples(Sequence):
    """The stored (key, array, label) samples, read from the shards the first time one is asked for
    (never when every tool's dataset is already built)."""

    def __init__(self, shards: Path):
        self.shards, self._list = shards, None

    def _all(self) -> list:
        if self._list is None:
            self._list = list(stored_samples(self.shards))
        return self._list

    def __len__(self) -> int:
        return len(self._all())

    def __getitem__(self, i):
        return self._all()[i]


def build_tool_baselines(work: Path, shards: Path, tools: list[str], workers: int) -> dict[str, Path]:
    """FFCV / litdata / MosaicML streaming datasets of the same stored pixels (cached in work/)."""
    samples = StoredSamples(shards)
    builders = {"ffcv": extra.build_ffcv, "litdata": extra.build_litdata, "streaming": extra.build_mds}
    return {t: builders[t](work, samples, workers=workers) for t in tools}


# --- baselines ------------------------------------------------------------------------------------
def _stack(samples):
    imgs, labels = zip(*samples)
    return torch.stack(imgs), torch.tensor(labels)


def _npy_to_chw(sample):
    arr, label = sample
    return torch.from_numpy(arr).permute(2, 0, 1), int(label)


def _pil_to_chw(sample):
    im, label = sample
    return torch.from_numpy(np.asarray(im)).permute(2, 0, 1), int(label)


def stock_wds(urls: list[str], batch: int, workers: int):
    import webdataset as wds

    ds = (
        wds.WebDataset(urls, shardshuffle=False, empty_check=False)
        .decode()
        .to_tuple("npy", "cls")
        .map(_npy_to_chw)
        .batched(batch, collation_fn=_stack, partial=True)
    )
    return torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers)


def jpeg_wds(urls: list[str], batch: int, workers: int):
    import webdataset as wds

    ds = (
        wds.WebDataset(urls, shardshuffle=False, empty_check=False)
        .decode("pil")
        .to_tuple("jpg", "cls")
        .map(_pil_to_chw)
        .batched(batch, collation_fn=_stack, partial=True)
    )
    return torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers)


class NpyCache(torch.utils.data.Dataset):
    def __init__(self, root: Path):
        self.root = root
        self.rows = [line.split("\t") for line in (root / "index.tsv").read_text().splitlines()]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        rel, label = self.rows[i]
        return torch.from_numpy(np.load(self.root / rel)).permute(2, 0, 1), int(label)


class H5(torch.utils.data.Dataset):
    def __init__(self, path: Path):
        import h5py

        self.path, self.f = path, None
        with h5py.File(path, "r") as f:
            self.n = len(f["labels"])

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import h5py

        if self.f is None:  # opened per worker process
            self.f = h5py.File(self.path, "r")
        return torch.from_numpy(self.f["images"][i]).permute(2, 0, 1), int(self.f["labels"][i])


def _read_files(paths: list[str]) -> int:
    buf = bytearray(8 << 20)
    total = 0
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                total += n
    return total


# --- timing ---------------------------------------------------------------------------------------
def _consume(images: torch.Tensor, staging: dict) -> None:
    """What a trainer does with every batch at least: read all of it (here: copy it into a reused
    buffer, as a copy into pinned memory for the GPU would). Without it, a loader whose batches
    arrive as untouched shared memory would look faster than one that has already paid for them."""
    key = (images.shape, images.stride())
    buf = staging.get(key)
    if buf is None:
        buf = staging[key] = torch.empty_like(images)  # same memory layout: a straight copy
    buf.copy_(images)


class Epochs:
    """One loader, timed an epoch per call after a first, untimed epoch (as a trainer's second epoch
    onwards: page cache, mappings and worker state warm), every batch consumed; each epoch from its
    first batch (worker start-up excluded).

    ``from_start``: from the iterator's creation instead, first batch included, for a loader whose
    first batch waits for a shuffle buffer to fill (worker start-up then counts against it too).
    ``warm=False``: no untimed first epoch.
    """

    def __init__(self, make, from_start: bool = False, warm: bool = True):
        self.loader, self.from_start, self.staging = make(), from_start, {}
        for b in self.loader if warm else ():  # warm-up epoch
            _consume(b[0], self.staging)

    def __call__(self) -> float:
        """samples/s of one epoch."""
        t_start = time.perf_counter()
        it = iter(self.loader)
        first = next(it)
        _consume(first[0], self.staging)
        t0, n = time.perf_counter(), 0
        if self.from_start:
            t0, n = t_start, len(first[1])
        for b in it:
            _consume(b[0], self.staging)
            n += len(b[1])
        return n / (time.perf_counter() - t0)


def rate(make, repeats: int, from_start: bool = False) -> float:
    """samples/s of one loader: the median of ``repeats`` timed epochs (``Epochs``)."""
    epoch = Epochs(make, from_start)
    return statistics.median(epoch() for _ in range(repeats))


def interleaved(entries: dict[str, object], rounds: int) -> dict[str, float]:
    """Medians of ``rounds`` rounds in which every entry (a callable giving the samples/s of one
    epoch, e.g. ``Epochs``) runs once, in turn: the loaders compared share the machine's noise."""
    rates: dict[str, list[float]] = {name: [] for name in entries}
    for _ in range(rounds):
        for name, epoch in entries.items():
            rates[name].append(epoch())
    return {name: statistics.median(r) for name, r in rates.items()}


def cat_epoch(urls: list[str], n_samples: int, processes: int):
    """An entry for ``interleaved``: ``cat`` of the shard files to /dev/null, in ``processes`` parallel
    processes (each a share of the files), as samples/s: the read limit of the page cache."""

    def epoch() -> float:
        t0 = time.perf_counter()
        procs = [subprocess.Popen(["cat", *urls[i::processes]], stdout=subprocess.DEVNULL) for i in range(processes)]
        if any(p.wait() for p in procs):
            raise RuntimeError("cat failed")
        return n_samples / (time.perf_counter() - t0)

    return epoch


# HAM10000's class mix (nv, mel, bkl, bcc, akiec, vasc, df: 6,705 ... 115 of 10,015 images)
HAM10000 = np.array([6705, 1113, 1099, 514, 327, 142, 115]) / 10015


def ham_skew(labels: np.ndarray) -> np.ndarray:
    """A fixed subset of a 7-class set whose class mix is HAM10000's (67% down to 1.1%)."""
    keep = HAM10000 / HAM10000.max()
    return np.random.default_rng(7).random(len(labels)) < keep[labels % 7]


def read_limit(urls: list[str], n_samples: int, workers: int, repeats: int) -> float:
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        if workers <= 1:
            _read_files(urls)
        else:
            with get_context("fork").Pool(workers) as pool:
                pool.map(_read_files, [urls[i::workers] for i in range(workers)])
        rates.append(n_samples / (time.perf_counter() - t0))
    return statistics.median(rates)


def subset_and_balanced(shards: Path, B: int, cores: int, repeats: int) -> tuple[dict, dict]:
    """The index reader's subsets and class-balanced epochs (train defaults): rates, bytes read,
    class mix. Each is timed interleaved with what it is compared with (``interleaved``)."""

    # short epochs: persistent workers and timing from each epoch's start, for the subset and the
    # full epoch it is compared with alike
    def timed(w: int, **kw) -> Epochs:
        opts = dict(train=True, num_workers=w, batch_size=B, split="train", persistent_workers=w > 0)
        return Epochs(lambda: make_loader(str(shards), **opts, **kw), from_start=True)

    skew = lambda cols: ham_skew(cols["label"])  # noqa: E731
    sub: dict = {"full": {}}
    bal: dict = {"plain": {}}
    for w in (0, cores):
        got = interleaved({"full": timed(w), "sub": timed(w, subset=0.1)}, repeats)
        sub[w], sub["full"][w] = got["sub"], got["full"]
        got = interleaved(
            {"plain": timed(w, subset=skew), "bal": timed(w, subset=skew, class_weights="balanced")}, repeats
        )
        bal[w], bal["plain"][w] = got["bal"], got["plain"]
    one, part = (
        make_loader(str(shards), train=True, num_workers=0, batch_size=B, split="train", drop_last=False, subset=s)
        for s in (None, 0.1)
    )
    for ld in (one, part):
        for _ in ld:
            pass
    sub["bytes"] = part.dataset._gather.bytes_read / one.dataset._gather.bytes_read
    sub["samples"] = len(part.dataset.rows)
    ld = make_loader(
        str(shards), num_workers=0, train=True, batch_size=B, split="train", subset=skew, class_weights="balanced"
    )
    labels = np.concatenate([b[1].numpy() for b in ld])
    k = len(ld.dataset.index.classes)
    bal["mix"] = np.bincount(labels, minlength=k) / len(labels)
    bal["worst"] = float(np.abs(bal["mix"] - 1 / k).max())
    rows = ld.dataset.rows
    bal["n"] = len(rows)
    bal["skew"] = float(np.bincount(ld.dataset.index.label[rows]).max() / len(rows))
    return sub, bal


# --- this tree against another (--against) -------------------------------------------------------
# Run in a process whose sys.path starts with the tree timed: builds one loader, times an epoch
# (as ``Epochs``: after an untimed one, from its first batch, every batch copied once) per line read.
SERVE = r"""
import sys, time, math, torch, warnings
tree, mode, shards, B, W = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
sys.path.insert(0, tree)
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
torch.set_num_threads(1)
from training_adapter import make_loader

class UserCropFlip:
    # what a user writes after torchvision: RandomResizedCrop.get_params' draw, a uint8 antialiased
    # bilinear resize to 224, a horizontal flip half the time
    def __call__(self, x):
        _, H, W_ = x.shape
        for _ in range(10):
            area = H * W_ * float(torch.empty(()).uniform_(0.08, 1.0))
            r = math.exp(float(torch.empty(()).uniform_(math.log(3 / 4), math.log(4 / 3))))
            w, h = int(round(math.sqrt(area * r))), int(round(math.sqrt(area / r)))
            if 0 < w <= W_ and 0 < h <= H:
                break
        else:
            h, w = H, W_
        i, j = int(torch.randint(0, H - h + 1, ())), int(torch.randint(0, W_ - w + 1, ()))
        y = torch.nn.functional.interpolate(x[None, :, i:i + h, j:j + w], size=(224, 224), mode="bilinear",
                                            antialias=True)[0]
        return y.flip(-1) if torch.rand(()) < 0.5 else y

kw = dict(batch_size=B, num_workers=W, split="train")
if mode == "train":
    loader = make_loader(shards, train=True, **kw)
elif mode == "eval":
    loader = make_loader(shards, train=False, **kw)
elif mode.startswith("stream-"):
    loader = make_loader(shards, train=mode == "stream-train", reader="stream", **kw)
elif mode == "crop-flip":
    loader = make_loader(shards, train=True, augment=dict(vflip=0.0, rot90=False, brightness=0.0, contrast=0.0),
                         **kw)
else:
    loader = make_loader(shards, train=True, augment=False, transform=UserCropFlip(), **kw)
staging = {}
def consume(x):
    buf = staging.get((x.shape, x.stride()))
    if buf is None:
        buf = staging[(x.shape, x.stride())] = torch.empty_like(x)
    buf.copy_(x)
for b in loader:
    consume(b[0])
print("ready", flush=True)
clock = time.process_time if W == 0 else time.perf_counter  # one process: its CPU time, less noisy
for line in sys.stdin:
    it = iter(loader)
    consume(next(it)[0])
    t0, n = clock(), 0
    for b in it:
        consume(b[0])
        n += len(b[1])
    print(n / (clock() - t0), flush=True)
"""


# Run in a process whose sys.path starts with the tree timed: one loader (train defaults, persistent and
# pin as asked); per line read, one epoch whose batches are dropped as they come: the main process's CPU
# seconds per batch (process_time: every thread of this process) and the wall rate.
SERVE_CPU = r"""
import sys, time, torch, warnings
tree, shards, B, W, persistent, pin = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1", sys.argv[6] == "1"
sys.path.insert(0, tree)
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
torch.set_num_threads(1)
from training_adapter import make_loader

loader = make_loader(shards, train=True, batch_size=B, num_workers=W, persistent_workers=persistent, pin_memory=pin)
for b in loader:
    pass
print("ready", flush=True)
for line in sys.stdin:
    n, cpu0, t0 = 0, time.process_time(), time.perf_counter()
    for b in loader:
        n += 1
        del b
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
    ring = getattr(loader, "ring", None)
    print(cpu / n * 1e3, n * B / wall, getattr(ring, "copies", -1), flush=True)
"""


def served_rounds(servers: dict, rounds: int) -> dict:
    """Start each server (key -> (argv, cwd); it prints "ready" once warm, then one line per "go"), then time
    them in interleaved rounds, every other round in the reverse order so that none always goes first: the
    reply lines of each, by key."""
    procs = {}
    for key, (argv, cwd) in servers.items():
        p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=cwd)
        assert p.stdout is not None
        if p.stdout.readline().strip() != "ready":
            raise SystemExit(f"{key}: the loader did not start")
        procs[key] = p
    replies: dict = {k: [] for k in procs}
    for r in range(rounds):
        for k, p in list(procs.items()) if r % 2 == 0 else list(procs.items())[::-1]:
            assert p.stdin is not None and p.stdout is not None
            p.stdin.write("go\n")
            p.stdin.flush()
            replies[k].append(p.stdout.readline())
    for p in procs.values():
        assert p.stdin is not None
        p.stdin.close()
        p.wait()
    return replies


def main_cpu(trees: list[tuple[str, Path]], shards: Path, B: int, W: int, rounds: int) -> None:
    """The training process's CPU per batch, each tree and (persistent_workers, pin_memory), interleaved rounds."""
    configs = [(p, pin) for p in (True, False) for pin in ((False, True) if torch.cuda.is_available() else (False,))]
    servers = {
        (who, persistent, pin): (
            [
                sys.executable,
                "-c",
                SERVE_CPU,
                str(root),
                str(shards),
                str(B),
                str(W),
                str(int(persistent)),
                str(int(pin)),
            ],
            str(root),
        )
        for who, root in trees
        for persistent, pin in configs
    }
    got = {
        k: [(float(ms), float(rate), int(copies)) for ms, rate, copies in (line.split() for line in v)]
        for k, v in served_rounds(servers, rounds).items()
    }
    print(
        f"main-process CPU per batch of {B} (process_time, every thread), train defaults, num_workers {W}, "
        f"{rounds} interleaved rounds, median (min-max); samples/s wall; batches copied out of the ring"
    )
    print("| tree | persistent_workers | pin_memory | ms CPU / batch | samples/s | ring copies |")
    print("|---|---|---|---|---|---|")
    med = {}
    for (who, persistent, pin), v in got.items():
        ms = [x[0] for x in v]
        med[(who, persistent, pin)] = statistics.median(ms)
        print(
            f"| {who} | {persistent} | {pin} | {statistics.median(ms):.2f} ({min(ms):.2f}-{max(ms):.2f}) | "
            f"{statistics.median(x[1] for x in v):,.0f} | {v[-1][2] if v[-1][2] >= 0 else '-'} |"
        )
    if len(trees) == 2:
        (a, _), (b, _) = trees
        for persistent, pin in configs:
            print(
                f"- persistent_workers={persistent}, pin_memory={pin}: {b} / {a} = "
                f"{med[(b, persistent, pin)] / med[(a, persistent, pin)]:.2f}"
            )


def against(tree: Path, shards: Path, B: int, W: int, rounds: int) -> None:
    """This tree's loader against ``tree``'s: interleaved rounds of one epoch each, medians, ratios."""
    here = Path(__file__).resolve().parents[1]
    entries = [
        ("before", tree, "train"),
        ("after", here, "train"),
        ("before", tree, "eval"),
        ("after", here, "eval"),
        ("before", tree, "stream-train"),
        ("after", here, "stream-train"),
        ("before", tree, "stream-eval"),
        ("after", here, "stream-eval"),
        ("after", here, "crop-flip"),
        ("after", here, "transform"),
    ]
    servers = {
        (who, mode): ([sys.executable, "-c", SERVE, str(root), mode, str(shards), str(B), str(W)], str(root))
        for who, root, mode in entries
    }
    rates = {k: [float(line) for line in v] for k, v in served_rounds(servers, rounds).items()}
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(
        f"{rounds} interleaved rounds, batch {B}, num_workers {W}; samples/s"
        f"{' of CPU time (one process)' if W == 0 else ''}, median (min-max)"
    )
    for (who, mode), v in rates.items():
        print(f"  {who:6s} {mode:10s} {med[(who, mode)]:8.0f}  ({min(v):.0f}-{max(v):.0f})")
    for mode in ("train", "eval", "stream-train", "stream-eval"):
        print(f"{mode}: after / before = {med[('after', mode)] / med[('before', mode)]:.2f}")
    print(
        f"transform=UserCropFlip (augment=False) / built-in crop + flip = "
        f"{med[('after', 'transform')] / med[('after', 'crop-flip')]:.2f}; "
        f"/ built-in default = {med[('after', 'transform')] / med[('after', 'train')]:.2f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3, help="timed epochs per loader in the tables (median)")
    ap.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="interleaved rounds of the head-to-head, subset and balanced comparisons (median)",
    )
    ap.add_argument("--work", default="/tmp/wds-bench")
    ap.add_argument("--against", type=Path, help="time this tree's loader against the one in this checkout")
    ap.add_argument("--workers", type=int, help="--against, --main-cpu: num_workers (default: every core)")
    ap.add_argument("--main-cpu", action="store_true", help="the training process's CPU per batch (see above)")
    args = ap.parse_args()
    if args.main_cpu:
        shards = build(Path(args.work) / f"n{args.samples}", args.samples)
        here = Path(__file__).resolve().parents[1]
        trees = ([("before", args.against.resolve())] if args.against else []) + [("after", here)]
        return main_cpu(trees, shards, args.batch, usable_cpus() if args.workers is None else args.workers, args.rounds)
    if args.against:
        shards = build(Path(args.work) / f"n{args.samples}", args.samples)
        return against(
            args.against, shards, args.batch, usable_cpus() if args.workers is None else args.workers, args.rounds
        )
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
    work = Path(args.work) / f"n{args.samples}"  # a corpus per size: longer epochs amortize worker start-up
    cores = usable_cpus()
    t0 = time.perf_counter()
    shards = build(work, args.samples)
    base = build_baselines(work, shards)
    missing = {t: extra.missing(t) for t in extra.TOOLS}
    for t, why in missing.items():
        if why and why.endswith(f"No module named '{t}'"):
            print(f"skipped: {t} not installed ({extra.INSTALL[t]})")
        elif why:
            print(f"skipped: {t} does not import ({why}); to install: {extra.INSTALL[t]}")
    tools = [t for t, why in missing.items() if why is None]
    data = build_tool_baselines(work, shards, tools, cores)
    urls = sorted(str(p) for p in shards.glob("train-*.tar"))
    n = args.samples
    print(
        f"{n} samples of {SIZE}x{SIZE}x3 uint8 in {len(urls)} shards, batch {args.batch}, {cores} cores "
        f"(data built in {time.perf_counter() - t0:.0f} s)\n",
        flush=True,
    )
    B = args.batch
    ours = dict(batch_size=B, split="train")
    rows = [
        (
            "training_adapter, eval (uint8), index reader (the default with an index; workers: threads)",
            "eval",
            lambda w: make_loader(str(shards), train=False, num_workers=w, **ours),
        ),
        (
            "training_adapter, eval (uint8), streaming reader",
            "eval",
            lambda w: make_loader(str(shards), train=False, num_workers=w, reader="stream", **ours),
        ),
        (
            "training_adapter, train, every option at its default (index reader: an epoch permutation, CPU augmentation)",
            "train",
            lambda w: make_loader(str(shards), train=True, num_workers=w, **ours),
        ),
        (
            "training_adapter, train, streaming reader, shuffle buffer 1000 (the previous default)",
            "train",
            lambda w: make_loader(str(shards), train=True, num_workers=w, reader="stream", **ours),
        ),
        (
            "training_adapter, train, device_augment (read + batch only; workers: threads)",
            "train",
            lambda w: make_loader(str(shards), train=True, device_augment=True, num_workers=w, **ours),
        ),
        ("stock webdataset .decode().to_tuple('npy','cls') + torch.stack", "eval", lambda w: stock_wds(urls, B, w)),
        (
            "per-file .npy cache, np.load",
            "eval",
            lambda w: torch.utils.data.DataLoader(NpyCache(base["npy"]), batch_size=B, num_workers=w),
        ),
        (
            "HDF5 via h5py, per index",
            "eval",
            lambda w: torch.utils.data.DataLoader(H5(base["h5"]), batch_size=B, num_workers=w),
        ),
        ("webdataset, 224 px JPEG decoded by PIL", "eval", lambda w: jpeg_wds(base["jpg"], B, w)),
    ]
    OURS = 5  # rows before the baselines
    # The competing tools' eval loaders (stored order, stored pixels) join the eval baselines.
    eval_names = {
        "ffcv": "FFCV .beton (raw RGB, no JPEG), SimpleRGBImageDecoder, sequential (num_workers 0: 1 worker thread)",
        "litdata": "litdata optimize'd chunks, StreamingDataset + StreamingDataLoader, no shuffle",
        "streaming": "MosaicML streaming MDS (ndarray:uint8), StreamingDataset(local) + DataLoader, no shuffle",
    }
    loaders = {"ffcv": extra.ffcv_loader, "litdata": extra.litdata_loader, "streaming": extra.mds_loader}
    for t in tools:
        rows.append((eval_names[t], "eval", lambda w, t=t: loaders[t](data[t], train=False, workers=w, batch=B)))
    # Train mode: random order + random-resized crop (scale 0.08-1, ratio 3/4-4/3) to 224 + horizontal flip.
    # Ours with only those two steps (its default adds flips, quarter turns and jitter) and the
    # default shuffle buffer, timed from the iterator's start like the default row.
    train_rows = [
        (
            "training_adapter, shuffle buffer 1000, crop + horizontal flip only (as the tools below)",
            lambda w: make_loader(
                str(shards),
                train=True,
                num_workers=w,
                batch_size=B,
                augment=dict(vflip=0.0, rot90=False, brightness=0.0, contrast=0.0),
            ),
            True,
        )
    ]
    train_names = {
        "ffcv": "FFCV, random order, RandomResizedCropRGBImageDecoder + RandomHorizontalFlip (num_workers 0: 1 worker thread)",
        "litdata": "litdata, shuffle=True, crop + flip per sample in torch",
        "streaming": "MosaicML streaming, shuffle=True (py1e), crop + flip per sample in torch",
    }
    for t in tools:
        train_rows.append((train_names[t], lambda w, t=t: loaders[t](data[t], train=True, workers=w, batch=B), False))
    results: dict[str, dict[int, float]] = {}
    for name, _, make in rows:
        results[name] = {
            w: rate(lambda make=make, w=w: make(w), args.repeats, from_start="shuffle buffer" in name)
            for w in (0, cores)
        }
        print(f"  {name}: " + ", ".join(f"{v:,.0f}/s" for v in results[name].values()), file=sys.stderr, flush=True)
    results["read limit: shard files, 8 MiB readinto, no parsing"] = {
        w: read_limit(urls, n, max(1, w), args.repeats) for w in (0, cores)
    }
    train_results: dict[str, dict[int, float]] = {rows[2][0]: results[rows[2][0]], rows[3][0]: results[rows[3][0]]}
    for name, make, from_start in train_rows:
        train_results[name] = {
            w: rate(lambda make=make, w=w: make(w), args.repeats, from_start=from_start) for w in (0, cores)
        }
        print(
            f"  {name}: " + ", ".join(f"{v:,.0f}/s" for v in train_results[name].values()), file=sys.stderr, flush=True
        )
    stock = results[rows[OURS][0]]
    print(f"| loader | samples/s, num_workers 0 | samples/s, num_workers {cores} | vs stock webdataset (0 / {cores}) |")
    print("|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r[0]:,.0f} | {r[cores]:,.0f} | {r[0] / stock[0]:.2f}x / {r[cores] / stock[cores]:.2f}x |")
    ref_name = train_names["ffcv"] if "ffcv" in tools else train_rows[0][0]
    ref, ref_label = train_results[ref_name], "FFCV" if "ffcv" in tools else "ours, crop + flip"
    print(
        f"\nTrain mode (random order, random-resized crop to {SIZE} + horizontal flip, uint8; not in the checks "
        "below, which compare eval-mode loaders):\n"
    )
    print(f"| loader | samples/s, num_workers 0 | samples/s, num_workers {cores} | vs {ref_label} (0 / {cores}) |")
    print("|---|---|---|---|")
    for name, r in train_results.items():
        print(f"| {name} | {r[0]:,.0f} | {r[cores]:,.0f} | {r[0] / ref[0]:.2f}x / {r[cores] / ref[cores]:.2f}x |")
    ev_table, tr, trs, dev = (results[rows[i][0]] for i in (0, 2, 3, 4))
    baselines = [results[r[0]] for r in rows[OURS:]]
    # Head to head, interleaved (each round times every entry once, in turn): the eval targets,
    # the cost of each check_samples level, and the read limits, under the same noise
    entries: dict[str, object] = {}
    for w in (0, cores):
        for check in ("labels", True, False):
            entries[f"ours eval, check_samples={check!r}, num_workers {w}"] = Epochs(
                lambda w=w, check=check: make_loader(
                    str(shards), train=False, num_workers=w, check_samples=check, **ours
                )
            )
        if "ffcv" in tools:
            entries[f"FFCV eval, num_workers {w}"] = Epochs(
                lambda w=w: loaders["ffcv"](data["ffcv"], train=False, workers=w, batch=B)
            )
        entries[f"cat of the shard files, {max(1, w)} process(es)"] = cat_epoch(urls, n, max(1, w))
    print(f"\nHead to head: {args.rounds} interleaved rounds, medians (samples/s):\n", flush=True)
    head = interleaved(entries, args.rounds)
    for name, r in head.items():
        print(f"- {name}: {r:,.0f}")
    ev = {w: head[f"ours eval, check_samples='labels', num_workers {w}"] for w in (0, cores)}
    pix = {w: head[f"ours eval, check_samples=True, num_workers {w}"] for w in (0, cores)}
    bare = {w: head[f"ours eval, check_samples=False, num_workers {w}"] for w in (0, cores)}
    cat = {w: head[f"cat of the shard files, {max(1, w)} process(es)"] for w in (0, cores)}
    sub, bal = subset_and_balanced(shards, B, cores, args.rounds)
    checks = [
        ("eval >= 35,000 samples/s with num_workers 0 (head to head)", ev[0] >= 35000),
        (
            "eval >= 4x stock webdataset (both worker counts, table)",
            min(ev_table[0] / stock[0], ev_table[cores] / stock[cores]) >= 4,
        ),
        ("train (every option at its default) >= 3,000 samples/s per worker process (num_workers 0)", tr[0] >= 3000),
        (
            "train (every option at its default) no slower than the previous default (streaming + shuffle buffer)",
            all(tr[w] >= trs[w] for w in (0, cores)),
        ),
        (
            "eval ahead of every baseline (none of them augments: they are eval-mode loaders; table)",
            all(ev_table[w] > b[w] for b in baselines for w in (0, cores)),
        ),
        (
            "train with device_augment (workers read and batch) ahead of every baseline but FFCV",
            all(
                dev[w] > b[w] for b, r in zip(baselines, rows[OURS:]) if not r[0].startswith("FFCV") for w in (0, cores)
            ),
        ),
        ("10% subset reads <= 15% of the bytes", sub["bytes"] <= 0.15),
        (
            "10% subset runs at >= 70% of the full epoch's samples/s (train defaults, both worker counts)",
            min(sub[w] / sub["full"][w] for w in (0, cores)) >= 0.7,
        ),
        (
            "balanced epochs at >= 80% of plain train mode's samples/s on the same subset (both worker counts)",
            min(bal[w] / bal["plain"][w] for w in (0, cores)) >= 0.8,
        ),
        (
            "balanced epoch's class mix within 2 percentage points of uniform on a HAM10000-skewed set",
            bal["worst"] <= 0.02,
        ),
    ]
    print()
    fu, pl = sub["full"], bal["plain"]
    print(
        f"- subset=0.1, train defaults (persistent workers, timed from each epoch's start): {sub[0]:,.0f} / "
        f"{sub[cores]:,.0f} samples/s (num_workers 0 / {cores}), the full epoch {fu[0]:,.0f} / {fu[cores]:,.0f}: "
        f"{sub[0] / fu[0]:.2f} / {sub[cores] / fu[cores]:.2f}; bytes read {sub['bytes']:.3f} of a full epoch's "
        f"({sub['samples']} samples)"
    )
    print(
        f"- class_weights='balanced' on a HAM10000-skewed subset ({bal['n']} samples, largest class "
        f"{bal['skew']:.1%}): {bal[0]:,.0f} / {bal[cores]:,.0f} samples/s, plain train on the same subset "
        f"{pl[0]:,.0f} / {pl[cores]:,.0f}: {bal[0] / pl[0]:.2f} / {bal[cores] / pl[cores]:.2f}; class mix "
        f"{', '.join(f'{x:.1%}' for x in bal['mix'])} (worst {bal['worst'] * 100:.2f} points from uniform)"
    )
    print(
        f"- eval, index reader (head to head): {ev[0] / cat[0]:.2f} / {ev[cores] / cat[cores]:.2f} of cat's "
        f"rate (num_workers 0 against 1 cat / {cores} against {cores} cats in parallel)"
    )
    print(
        f"- check_samples cost, eval (head to head): the default 'labels' against False: "
        f"{1 - ev[0] / bare[0]:.1%} / {1 - ev[cores] / bare[cores]:.1%}; True (labels and npy_xxh3) against "
        f"False: {1 - pix[0] / bare[0]:.1%} / {1 - pix[cores] / bare[cores]:.1%} (num_workers 0 / {cores})"
    )
    for text, ok in checks:
        print(f"- {'PASS' if ok else 'FAIL'}: {text}")
    if "ffcv" in tools:
        ff = {w: head[f"FFCV eval, num_workers {w}"] for w in (0, cores)}
        print(
            "- eval, ours / FFCV (head to head): "
            + "; ".join(
                f"num_workers {w}: {ev[w]:,.0f} / {ff[w]:,.0f} samples/s = {ev[w] / ff[w]:.2f}x"
                + (" (FFCV: 1 worker thread)" if w == 0 else "")
                for w in (0, cores)
            )
        )
        print(f"- {'PASS' if ev[cores] >= ff[cores] else 'FAIL'}: eval with {cores} workers >= FFCV's (head to head)")
    for w in (0, cores):  # not a target: augmenting on the CPU against loaders that do not augment at all
        best = max(baselines, key=lambda b: b[w])
        name = rows[OURS + baselines.index(best)][0]
        print(
            f"- note: num_workers {w}: train with CPU augmentation {tr[w]:,.0f}/s, the fastest baseline "
            f"(no augmentation: {name}) {best[w]:,.0f}/s"
        )
    if torch.cuda.is_available():
        device_bench(B)


def device_bench(B: int) -> None:
    from training_adapter import AugmentConfig, augment_batch

    dev = torch.device("cuda")
    x = torch.randint(0, 256, (256, 3, SIZE, SIZE), dtype=torch.uint8, device=dev)
    keys = [f"k{i}" for i in range(256)]
    for cfg in (AugmentConfig(), AugmentConfig(affine_p=1.0, saturation=0.2)):
        from training_adapter.augment import batch_params

        p = torch.as_tensor(
            batch_params(cfg, seed=0, epoch=0, keys=keys, src_size=SIZE), dtype=torch.float32, device=dev
        )
        for _ in range(3):
            augment_batch(x, p, config=cfg, mean=[0.5] * 3, std=[0.25] * 3)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(20):
            augment_batch(x, p, config=cfg, mean=[0.5] * 3, std=[0.25] * 3)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        print(
            f"- {torch.cuda.get_device_name()}: augment_batch + normalize, batch 256, {cfg.affine_p=}, "
            f"{cfg.saturation=}: {20 * 256 / dt:,.0f} samples/s"
        )


if __name__ == "__main__":
    main()
