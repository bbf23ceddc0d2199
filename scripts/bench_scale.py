"""Scale-out figures in one run: the Ray executor against the local pool, and the loader reading
from an S3-compatible server against local disk.

1. Converter: the same manifest of 12 MP JPEGs (bench_convert.py's corpus) converted with the
   local process pool and with --executor ray on a local Ray instance of the same cores, each
   into a fresh folder. Rate = ConvertResult.images_per_second (decode + write phase); Ray is
   started before timing, as a cluster would be. Target: Ray >= 85% of local.
2. Loader: 224 px shards (bench_loader.py's corpus) read by training_adapter in eval mode
   (num_workers 0, batch 64) from local disk (each shard's cached pages dropped with
   posix_fadvise before a run, so the bytes come from the disk), from the page cache (for
   reference), and from moto's S3 server started on 127.0.0.1 in its own process.
   Target: S3 >= 50% of local disk.
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
from bench_loader import build, rate  # noqa: E402
from bench_verify import drop_cache  # noqa: E402

from wds_tools.convert import convert  # noqa: E402

RAY_TARGET, S3_TARGET = 0.85, 0.50


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
                r = convert(manifest, version="v1", size=224, out=out, workers=cores, shard_size=shard_size,
                            executor=executor, reuse=False, progress=False)
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


def loader(work: Path, samples: int, repeats: int) -> tuple[float, float]:
    from training_adapter import make_loader

    shards = build(work, samples)
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1",
                      AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}")
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
        local = rate(lambda: make_loader(str(shards), batch_size=64, train=False, num_workers=0, split="train"),
                     repeats)

        def cold_loader():  # local disk, not the page cache: drop each shard's cached pages first
            drop_cache(sorted(shards.glob("*.tar")))
            return make_loader(str(shards), batch_size=64, train=False, num_workers=0, split="train")

        cold = rate(cold_loader, repeats)
        remote = rate(lambda: make_loader("s3://bench/v1/224", batch_size=64, train=False, num_workers=0,
                                          split="train"), repeats)
    finally:
        server.terminate()
        server.wait()
    return local, cold, remote


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=96, help="12 MP JPEGs for the converter (default 96)")
    ap.add_argument("--data", default="bench-data/convert")
    ap.add_argument("--samples", type=int, default=2048, help="224 px samples for the loader (default 2048)")
    ap.add_argument("--work", default="/tmp/wds-bench")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    local_ips, ray_ips = converter(Path(args.data), args.count, args.repeats)
    disk, cold, s3 = loader(Path(args.work), args.samples, args.repeats)
    m = machine()
    print(f"\nMachine: {m['cores usable (affinity)']} cores, {m['CPU']}, Python {m['Python']}; medians of {args.repeats}")
    print("| measure | local | scale-out | ratio | target |\n|---|---|---|---|---|")
    ok_ray, ok_s3 = ray_ips >= RAY_TARGET * local_ips, s3 >= S3_TARGET * cold
    print(f"| convert images/s: process pool vs Ray executor | {local_ips:.1f} | {ray_ips:.1f} | "
          f"{ray_ips / local_ips:.2f} | >= {RAY_TARGET} {'PASS' if ok_ray else 'FAIL'} |")
    print(f"| loader samples/s: local disk (pages dropped) vs S3 (moto, 127.0.0.1) | {cold:,.0f} | {s3:,.0f} | "
          f"{s3 / cold:.2f} | >= {S3_TARGET} {'PASS' if ok_s3 else 'FAIL'} |")
    print(f"| loader samples/s: page cache vs S3 (for reference) | {disk:,.0f} | {s3:,.0f} | {s3 / disk:.2f} | |")
    if args.check and not (ok_ray and ok_s3):
        sys.exit(1)


if __name__ == "__main__":
    main()
