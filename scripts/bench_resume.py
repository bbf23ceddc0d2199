"""Resume: time from ``load_state_dict`` to the first batch, with an index of 1,000,000 samples.

Builds real shards of --samples samples of 32 px, --per-shard a shard (977 shards for 1,000,000; about 7 GB,
kept in --work for the next run), as the converter writes them: each sample is one of a real conversion's
(``wds_tools.convert.convert`` of 12 photos) under its own key, its .json naming that key, so the reader reads
and checks them as usual (the .npy's tar header names its key); the index is the conversion's index.json with
these shards and counts, written by ``write_index``. A loader reads a few
batches and saves its state at --at of the epoch; a fresh loader (made beforehand: reading
samples.npz is make_loader's work) then times ``load_state_dict`` + the first batch. The baseline,
in the same rounds: the same fresh loader's first batch of a fresh epoch (``iter`` + ``next``).
Median of --rounds, interleaved; num_workers 0 and 2.

    .venv/bin/python scripts/bench_resume.py [--samples 1000000] [--rounds 5] [--work /tmp/wds-bench-resume]

``--reader stream``: the streaming reader, which resumes by replaying each worker's stream up to where
it stopped (resume.py). Real shards of --stream-samples samples of 32 px (shardkit), the default
1000-sample shuffle buffer, the state saved at --at of the epoch; timed in the same rounds: a fresh
epoch's first batch, the uninterrupted epoch's first ``stop + 1`` batches (what the replay reads
again, and collates), and ``load_state_dict`` + the first batch of the rest.

    .venv/bin/python scripts/bench_resume.py --reader stream [--stream-samples 16000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from shardkit import build_dataset  # noqa: E402

from training_adapter import make_loader  # noqa: E402
from wds_tools.format.index import load_index, write_index  # noqa: E402
from wds_tools.format.names import url_pattern  # noqa: E402
from wds_tools.format.packed import pack_strings  # noqa: E402
from wds_tools.format.sample import column_prefix, sample_json  # noqa: E402
from wds_tools.format.tarwrite import ShardWriter  # noqa: E402

PER_SHARD = 1024  # samples a shard: 977 shards for 1,000,000, as many as the figures in docs/guide/training.md had


TEMPLATE = 12  # photos of the template conversion, 3 classes


def template(work: Path) -> Path:
    """A real conversion (``wds_tools.convert.convert``) of TEMPLATE photos at 32 px, every sample train: the
    samples and index.json ``build`` repeats."""
    from wds_tools.convert import convert
    from wds_tools.synth import jpeg_bytes, lesion_photo

    src = work / "template-source"
    (src / "images").mkdir(parents=True, exist_ok=True)
    lines = ["key,label,path"]
    for k in range(TEMPLATE):
        (src / "images" / f"t{k:02d}.jpg").write_bytes(jpeg_bytes(lesion_photo(96, 96, k % 3, 900 + k)))
        lines.append(f"t{k:02d},c{k % 3},images/t{k:02d}.jpg")
    (src / "manifest.csv").write_text("\n".join(lines) + "\n")
    convert(src / "manifest.csv", version="template", size=32, out=work / "template", workers=1, val_fraction=0.0,
            progress=False)  # fmt: skip
    return work / "template" / "template" / "32"


def build(work: Path, samples: int, per: int = PER_SHARD) -> Path:
    """Real shards of ``samples`` samples of 32 px, ``per`` a shard, as the converter writes them: each sample the
    template conversion's sample ``i % TEMPLATE`` (its .cls, .i32, .npy, and its .json with the new key) under
    its own key ``r<i>`` (the loader checks each .npy's tar header against its key), written by the format's
    ShardWriter; the index (``write_index``) is the template's with these rows, shards and counts."""
    dest = work / f"resume-{samples}-{per}"
    if (dest / "index.json").exists():
        return dest
    tmpl = load_index(template(work))
    tcols = tmpl.samples.columns
    order = np.argsort(tcols["key"])
    members = tmpl.meta["sample"]["members"]
    parts = []  # each template sample's members' bytes, in key order
    for r in order.tolist():
        with open(tmpl.root / tmpl.shards[int(tcols["shard"][r])]["name"], "rb") as f:
            got = {}
            for m in members:
                f.seek(int(tcols[f"{column_prefix(m)}_offset"][r]))
                got[m] = f.read(int(tcols[f"{column_prefix(m)}_length"][r]))
        parts.append((got, json.loads(got["json"])))
    dest.mkdir(parents=True, exist_ok=True)
    names = -(-samples // per)
    cols = {f"{column_prefix(m)}_{x}": np.zeros(samples, "<u8") for m in members for x in ("offset", "length")}
    shards = []
    for j in range(names):
        w = ShardWriter(str(dest / f"train-{j:06d}.tar"))
        for i in range(j * per, min(samples, (j + 1) * per)):
            got, fields = parts[i % TEMPLATE]
            key = f"r{i:07d}"
            data = {**got, "json": sample_json({**fields, "key": key, "original_key": key,
                                                 "source_path": f"img/{key}.jpg"})}  # fmt: skip
            for m in members:
                p = column_prefix(m)
                cols[f"{p}_offset"][i], cols[f"{p}_length"][i] = w.add(f"{key}.{m}", data[m])
        nbytes, sha = w.close()
        shards.append({"name": f"train-{j:06d}.tar", "split": "train", "samples": min(per, samples - j * per),
                       "bytes": nbytes, "sha256": sha})  # fmt: skip
    take = order[np.arange(samples) % TEMPLATE]
    for name, col in tcols.items():
        if name not in cols and name not in ("path_offsets", "path_data") and len(col) == len(order):
            cols[name] = col[take]
    cols["shard"] = (np.arange(samples) // per).astype("<u4")
    cols["key"] = np.array([f"r{i:07d}".encode() for i in range(samples)], dtype="S")
    cols["path_offsets"], cols["path_data"] = pack_strings([f"img/r{i:07d}.jpg" for i in range(samples)])
    counts = np.bincount(cols["label"], minlength=len(tmpl.classes)).tolist()
    meta = {k: v for k, v in tmpl.meta.items() if k != "samples_file"}
    train = {**tmpl.meta["splits"]["train"], "samples": samples, "shards": names, "class_counts": counts,
             "urls": url_pattern("train", names)}  # fmt: skip
    meta.update(dataset_version="bench", samples=samples, class_counts=counts, shards=shards, splits={"train": train})
    meta["build"] = {**meta["build"], "shard_size": per, "source": {**meta["build"]["source"], "rows": samples}}
    write_index(dest, meta, cols)
    return dest


def stream(work: Path, samples: int, batch: int, at: float, rounds: int) -> None:
    """The streaming reader's resume (see the module docstring)."""
    per = 500
    dest = work / f"stream-{samples}"
    if not (dest / "index.json").exists():
        build_dataset(dest, {"train": [[(i + j) % 3 for i in range(per)] for j in range(-(-samples // per))]}, size=32)
    kw = dict(train=True, batch_size=batch, reader="stream")
    print(f"{samples:,} samples of 32 px in shards of {per}, shuffle buffer 1000, batch {batch}")
    print(
        f"{'workers':>8} {'fresh epoch, first batch':>26} {'first stop + 1 batches':>24} "
        f"{'load_state_dict + first batch':>31} {'/ fresh':>8} {'/ stop + 1':>11}"
    )
    for workers in (0, 2):
        ld = make_loader(dest, num_workers=workers, **kw)
        stop = int(at * len(ld))
        it = iter(ld)
        for _ in range(stop):
            next(it)
        state = ld.state_dict()
        del it, ld
        fresh_t, head_t, resume_t = [], [], []
        for _ in range(rounds):
            a = make_loader(dest, num_workers=workers, **kw)
            t0 = time.perf_counter()
            next(iter(a))
            fresh_t.append(time.perf_counter() - t0)
            h = make_loader(dest, num_workers=workers, **kw)
            t0 = time.perf_counter()
            it = iter(h)
            for _ in range(stop + 1):
                next(it)
            head_t.append(time.perf_counter() - t0)
            del it
            b = make_loader(dest, num_workers=workers, **kw)
            t0 = time.perf_counter()
            b.load_state_dict(state)
            next(iter(b))
            resume_t.append(time.perf_counter() - t0)
            del a, b, h
        f, hd, r = (statistics.median(x) for x in (fresh_t, head_t, resume_t))
        print(
            f"{workers:>8} {f * 1000:>23.0f} ms {hd * 1000:>21.0f} ms {r * 1000:>28.0f} ms {r / f:>8.1f} "
            f"{r / hd:>11.2f}   (stop after {stop} of {len(make_loader(dest, num_workers=workers, **kw))})"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reader", choices=("index", "stream"), default="index")
    ap.add_argument("--stream-samples", type=int, default=16_000)
    ap.add_argument("--samples", type=int, default=1_000_000)
    ap.add_argument("--per-shard", type=int, default=PER_SHARD, help="samples a shard (default %(default)s)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--at", type=float, default=0.9, help="where in the epoch the state is saved (fraction)")
    ap.add_argument("--work", default="/tmp/wds-bench-resume")
    args = ap.parse_args()
    if args.reader == "stream":
        return stream(Path(args.work), args.stream_samples, args.batch, args.at, args.rounds)
    t = time.perf_counter()
    dest = build(Path(args.work), args.samples, args.per_shard)
    print(f"index of {args.samples:,} samples in {dest} ({time.perf_counter() - t:.1f} s to build or find)")
    kw = dict(train=True, batch_size=args.batch)
    ld = make_loader(dest, num_workers=0, **kw)
    stop = int(args.at * len(ld))
    ld.load_state_dict({**ld.state_dict(), "position": stop * args.batch, "end": ld.dataset.epoch_span(1).end})
    next(iter(ld))  # one batch after the position: the state a run saves after batch stop + 1
    state = ld.state_dict()
    print(f"state after batch {stop + 1} of {len(ld)}: position {state['position']:,}")
    print(f"{'workers':>8} {'fresh epoch, first batch':>26} {'load_state_dict + first batch':>31} {'ratio':>6}")
    for workers in (0, 2):
        fresh_t, resume_t = [], []
        for _ in range(args.rounds):
            a = make_loader(dest, num_workers=workers, **kw)
            t0 = time.perf_counter()
            next(iter(a))
            fresh_t.append(time.perf_counter() - t0)
            b = make_loader(dest, num_workers=workers, **kw)
            t0 = time.perf_counter()
            b.load_state_dict(state)
            next(iter(b))
            resume_t.append(time.perf_counter() - t0)
            del a, b
        f, r = statistics.median(fresh_t), statistics.median(resume_t)
        print(f"{workers:>8} {f * 1000:>23.0f} ms {r * 1000:>28.0f} ms {r / f:>6.2f}")


if __name__ == "__main__":
    main()
