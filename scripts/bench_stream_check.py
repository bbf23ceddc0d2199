"""The streaming reader's dataset check (each sample's .json against the first sample's
``dataset_version`` and ``classes_digest``): its default against ``allow_mixed=True`` (no check),
eval and train, ``num_workers=0``, interleaved rounds, medians and the ratio. The shards are
bench_loader.py's corpus converted by this checkout (run bench_loader.py once first, or pass
--shards a folder of this format version).

    .venv/bin/python scripts/bench_stream_check.py [--shards /tmp/wds-bench/n8192/shards/v1/224] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_loader import Epochs  # noqa: E402

from training_adapter import make_loader  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shards", default="/tmp/wds-bench/n8192/shards/v1/224")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()
    torch.set_num_threads(1)
    configs = {
        f"{mode}, {name}": dict(train=mode == "train", allow_mixed=mixed)
        for mode in ("eval", "train")
        for name, mixed in (("checked (default)", False), ("allow_mixed=True", True))
    }
    epochs = {
        k: Epochs(
            lambda c=c: make_loader(
                args.shards, batch_size=args.batch, split="train", num_workers=0, reader="stream", **c
            )
        )
        for k, c in configs.items()
    }
    rates: dict[str, list[float]] = {k: [] for k in configs}
    for _ in range(args.rounds):
        for k, epoch in epochs.items():
            rates[k].append(epoch())
    for k, v in rates.items():
        print(f"{k:32s} {statistics.median(v):9,.0f} samples/s  {[round(x) for x in v]}")
    for mode in ("eval", "train"):
        ratio = statistics.median(rates[f"{mode}, checked (default)"]) / statistics.median(
            rates[f"{mode}, allow_mixed=True"]
        )
        print(f"{mode}: checked / unchecked = {ratio:.3f}")


if __name__ == "__main__":
    main()
