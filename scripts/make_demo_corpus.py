"""Generate the demo corpus: photo-like JPEGs of several sizes plus four bad files."""

import argparse
import shutil
from pathlib import Path

from wds_tools.synth import write_corpus

MARKER = ".wds-tools-demo-corpus"  # what tells a folder this script made (and may replace) from any other


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="corpus")
    ap.add_argument("--count", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    out = Path(args.out)
    if out.exists():  # made again from scratch, but only a folder this script made: never your own images
        if not (out / MARKER).is_file() and any(out.iterdir()):
            raise SystemExit(f"{out} exists and is not a demo corpus this script wrote; choose another --out")
        shutil.rmtree(out)
    manifest = write_corpus(out, count=args.count, seed=args.seed)
    (out / MARKER).write_text("written by scripts/make_demo_corpus.py; it replaces this folder when run again\n")
    print(f"wrote {args.count} JPEGs and 4 bad files; manifest {manifest}")


if __name__ == "__main__":
    main()
