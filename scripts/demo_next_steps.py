"""What to do after `make demo`: where the shards are, how to call the CLI, a training loop, the docs.

    .venv/bin/python scripts/demo_next_steps.py shards/v1/224 [report-v1-224.html]

The training loop is printed between the ``--- train.py`` and ``---`` lines;
tests/test_newcomer.py runs exactly that text in a fresh environment, so it cannot rot.
"""

from __future__ import annotations

import sys
from pathlib import Path

TRAIN_SNIPPET = """\
from training_adapter import make_loader, to_device

if __name__ == "__main__":  # the loader's worker processes import this file where they spawn (macOS)
    train = make_loader("{shards}", batch_size=64, train=True)
    print(train.classes, len(train), "batches per epoch")
    for epoch in range(2):
        train.set_epoch(epoch)  # a new shuffle and augmentation each epoch
        for images, labels in train:  # uint8 [64, 3, 224, 224] and int64 [64]
            x = to_device(images, "cpu", train.mean, train.std)  # "cuda" on a GPU: float32, normalised
            ...  # your model's forward and backward pass on (x, labels)
"""


def next_steps(shards: str, report: str | None = None) -> str:
    """The text printed at the end of `make demo` for the shards folder ``shards`` (and its ``report`` page)."""
    snippet = TRAIN_SNIPPET.format(shards=shards)
    page = f"\nThe demo set's page (open it in a browser): {Path(report).resolve().as_uri()}\n" if report else ""
    return f"""
Next steps
  The shards:  {shards}/  (train-*.tar, val-*.tar, index.json; the source images are in corpus/)
  The CLI:     source .venv/bin/activate    puts wds-tools on your PATH (or call .venv/bin/wds-tools)
               wds-tools stats {shards}
               wds-tools report {shards}   one HTML page: classes, metadata, thumbnails, near-duplicates
               wds-tools convert --help
  Your own environment:  pip install -e '.[train]'  (from this folder)
  Train on them (python in the activated .venv):
--- train.py
{snippet}---
  The docs:    make docs builds the site (guide pages and API reference) from docs/: open site/index.html
{page}"""


def main() -> None:
    """Print the next steps for the shards folder given as the first argument (and the report page, the second)."""
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: demo_next_steps.py SHARDS_FOLDER [REPORT_PAGE]")
    print(next_steps(*sys.argv[1:]))


if __name__ == "__main__":
    main()
