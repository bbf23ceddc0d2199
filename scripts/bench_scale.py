"""Scale-out figures in one run: the Ray executor against the local pool, and the loader reading
from an S3-compatible server against local disk.

1. Converter: the same manifest of 12 MP JPEGs (bench_convert.py's corpus) converted with the
   local process pool and with --executor ray on a local Ray instance of the same cores, each
   into a fresh folder. Rate = ConvertResult.images_per_second (decode + write phase); Ray is
   started before timing, as a cluster would be. Target: Ray >= 85% of local.
2. Loader: 224 px shards (bench_loader.py's corpus) uploaded to moto's S3 server, started on
   127.0.0.1 in its own process, and read by training_adapter in eval mode (the index reader:
   each batch one set of concurrent ranged GETs, neighbouring samples merged into ranges of at most
   4 MiB; num_workers 0, batch 64), against plain ranged GETs of the same shard bytes from the same
   server: the very ranges the loader asks for (``Gather.spans`` of each batch of the epoch), one
   fsspec ``cat_ranges`` call per batch as the loader makes them, nothing done with the bytes. Both,
   and the loader from local disk (page cache, and with each shard's cached pages dropped by
   posix_fadvise), are timed in interleaved rounds (bench_loader.interleaved), so they share the
   machine's noise; moto, a Python server, shares the two cores with the client.
   Target: the loader >= 80% of the plain ranged GETs' rate.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_convert import ensure_corpus, machine  # noqa: E402
from bench_loader import Epochs, build, interleaved  # noqa: E402
from bench_verify import drop_cache  # noqa: E402

from wds_tools.convert import convert  # noqa: E402

RAY_TARGET, S3_TARGET = 0.85, 0.80


def converter(data: Path, count: int, repeats: int) -> tuple[float, float]:
    manifest, _ = ensure_corpus(data, count)
    import logging

    import ray

    cores = os.cpu_count()
    ray.init(num_cpus=cores, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    shard_size = max(1, count // (4 * cores))
    rates: dict[str, list[float]] = {"local": [], "ray": []}
    try:
        for _ in range(repeats):
            for executor in ("local", "ray"):
                out = Path("bench-data/scale-out")
                shutil.rmtree(out, ignore_errors=True)
                r = convert(
                    manifest,
                    version="v1",
                    size=224,
                    out=out,
                    workers=cores,
                    shard_size=shard_size,
                    executor=executor,
                    reuse=False,
                    progress=False,
                )
                rates[executor].append(r.images_per_second)
                print(f"  {executor}: {r.images_per_second:.1f} images/s", flush=True)
    finally:
        ray.shutdown()
        shutil.rmtree("bench-data/scale-out", ignore_errors=True)
    return statistics.median(rates["local"]), statistics.median(rates["ray"])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def plain_gets(fs, requests: list[tuple[list[str], list[int], list[int]]], n_samples: int):
    """An entry for ``interleaved``: ``requests`` (one ``cat_ranges`` call each: paths, starts, ends)
    made in turn, nothing done with the bytes, as samples/s."""

    def epoch() -> float:
        t0 = time.perf_counter()
        for paths, starts, ends in requests:
            got = fs.cat_ranges(paths, starts, ends)
            if sum(map(len, got)) != sum(e - s for s, e in zip(starts, ends)):
                raise RuntimeError("a ranged GET came back short")
        return n_samples / (time.perf_counter() - t0)

    return epoch


def whole_shards(urls: list[str], sizes: list[int], per_call: int) -> list[tuple[list[str], list[int], list[int]]]:
    """Every shard read start to end in ranges of ``MERGE_MAX`` bytes, ``per_call`` per ``cat_ranges`` call."""
    from training_adapter.offsetread import MERGE_MAX

    ranges = [(u, a, min(a + MERGE_MAX, size)) for u, size in zip(urls, sizes) for a in range(0, size, MERGE_MAX)]
    return [
        ([u for u, _, _ in part], [a for _, a, _ in part], [b for _, _, b in part])
        for part in (ranges[i : i + per_call] for i in range(0, len(ranges), per_call))
    ]


def loader_requests(url: str, batch: int) -> list[tuple[list[str], list[int], list[int]]]:
    """The ranged reads an eval epoch of the loader makes (``Gather.spans`` of each batch, with the
    default label check): one ``cat_ranges`` call per batch."""
    from training_adapter import make_loader
    from training_adapter.offsetread import Gather

    ds = make_loader(url, batch_size=batch, train=False, split="train", num_workers=0).dataset
    gather = Gather(ds.index, labels=True)
    out = []
    for rows in ds.index_plan(0, 1, 0):
        spans = gather.spans(rows)
        out.append(([ds.index.urls[s] for s, *_ in spans], [sp[1] for sp in spans], [sp[2] for sp in spans]))
    return out


def loader(work: Path, samples: int, rounds: int) -> dict[str, float]:
    from training_adapter import make_loader

    shards = build(work, samples)
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    os.environ.update(
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
    )
    try:
        import s3fs

        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        fs = s3fs.S3FileSystem()
        fs.mkdir("bench")
        for p in sorted(shards.iterdir()):
            if p.is_file():
                fs.put_file(str(p), f"bench/v1/224/{p.name}")
        tars = sorted(shards.glob("train-*.tar"))
        eval_opts = dict(batch_size=64, train=False, split="train")

        def cold_epoch() -> float:
            """Local disk, not the page cache: a fresh loader (no mapping keeps pages in memory) after
            each shard's cached pages were dropped."""
            drop_cache(tars)
            return Epochs(lambda: make_loader(str(shards), num_workers=0, **eval_opts), warm=False)()

        entries = {
            "loader, S3 (moto), num_workers 0": Epochs(
                lambda: make_loader("s3://bench/v1/224", num_workers=0, **eval_opts)
            ),
            "plain ranged GETs of the same shard bytes, same server": plain_gets(
                fs, loader_requests("s3://bench/v1/224", 64), samples
            ),
            "for reference: whole shards in 4 MiB ranges, 3 per call (no batch boundaries)": plain_gets(
                fs, whole_shards([f"bench/v1/224/{p.name}" for p in tars], [p.stat().st_size for p in tars], 3), samples
            ),
            "loader, S3 (moto), num_workers 2 (reader threads)": Epochs(
                lambda: make_loader("s3://bench/v1/224", num_workers=2, **eval_opts)
            ),
            "loader, local disk (pages dropped), num_workers 0": cold_epoch,
            "loader, page cache, num_workers 0": Epochs(lambda: make_loader(str(shards), num_workers=0, **eval_opts)),
        }
        return interleaved(entries, rounds)
    finally:
        server.terminate()
        server.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=96, help="12 MP JPEGs for the converter (default 96)")
    ap.add_argument("--data", default="bench-data/convert")
    ap.add_argument("--samples", type=int, default=2048, help="224 px samples for the loader (default 2048)")
    ap.add_argument("--work", default="/tmp/wds-bench")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    ap.add_argument(
        "--part",
        choices=["all", "convert", "loader"],
        default="all",
        help="run the converter comparison, the loader one, or both (default)",
    )
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    m = machine()
    print(f"Machine: {m['cores usable (affinity)']} cores, {m['CPU']}, Python {m['Python']}")
    ok = True
    if args.part in ("all", "convert"):
        local_ips, ray_ips = converter(Path(args.data), args.count, args.repeats)
        ok_ray = ray_ips >= RAY_TARGET * local_ips
        ok &= ok_ray
        print(
            f"\nConverter, medians of {args.repeats}:\n\n| measure | local | Ray | ratio | target |\n|---|---|---|---|---|"
        )
        print(
            f"| convert images/s: process pool vs Ray executor | {local_ips:.1f} | {ray_ips:.1f} | "
            f"{ray_ips / local_ips:.2f} | >= {RAY_TARGET} {'PASS' if ok_ray else 'FAIL'} |"
        )
    if args.part in ("all", "loader"):
        got = loader(Path(args.work), args.samples, args.repeats)
        ours, plain = (
            got["loader, S3 (moto), num_workers 0"],
            got["plain ranged GETs of the same shard bytes, same server"],
        )
        ok_s3 = ours >= S3_TARGET * plain
        ok &= ok_s3
        print(
            f"\nLoader, {args.samples} samples of 224 px, batch 64, eval; {args.repeats} interleaved rounds, "
            f"medians:\n\n| reader | samples/s | vs plain ranged GETs |\n|---|---|---|"
        )
        for name, r in got.items():
            print(f"| {name} | {r:,.0f} | {r / plain:.2f} |")
        print(
            f"\n- {'PASS' if ok_s3 else 'FAIL'}: the loader from S3 >= {S3_TARGET} of plain ranged GETs of the "
            f"same shard bytes from the same server ({ours / plain:.2f})"
        )
    if args.check and not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
