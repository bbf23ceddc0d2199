"""Generate the demo corpus: photo-like JPEGs of several sizes plus four bad files."""

import argparse
import shutil
from pathlib import Path

from wds_tools.synth import write_corpus


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="demo/corpus")
    ap.add_argument("--count", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    manifest = write_corpus(out, count=args.count, seed=args.seed)
    print(f"wrote {args.count} JPEGs and 4 bad files; manifest {manifest}")


if __name__ == "__main__":
    main()
