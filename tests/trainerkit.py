"""Test helpers for the trainer recipes (tests/test_lightning.py, tests/test_accelerate.py): processes started
as torchrun starts them, the recipes read from their guide pages, and what a run saw, checked."""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "TORCHELASTIC_RUN_ID")


def recipe(page: str, name: str) -> str:
    """The python block of ``page`` (under the repository root) whose first line is ``# recipe: <name>``."""
    text = (ROOT / page).read_text(encoding="utf-8")
    found = [
        b
        for b in re.findall(r"```python\n(# recipe: [^\n]+\n.*?)```", text, re.S)
        if b.startswith(f"# recipe: {name}\n")
    ]
    assert len(found) == 1, f"{page} has no single recipe {name!r}"
    return found[0]


def join_group(rank: int, world: int, group: str) -> None:
    """Make this process rank ``rank`` of ``world`` as torchrun would (its environment variables), with the
    gloo process group already started (through the file ``group``: no port to pick), which Lightning and
    Accelerate then use as it is."""
    import multiprocessing

    import torch
    import torch.distributed as dist

    # one OpenMP thread per rank: two ranks of two spinning threads each on the 2-core VM made every op of the tiny
    # models take tens of ms under load (a conv 26 ms, a batch norm 45 ms); Accelerate keeps OMP_NUM_THREADS when set
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    multiprocessing.set_start_method("fork", force=True)  # the loader's workers, as under torchrun on Linux
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
        GROUP_RANK="0",
        TORCHELASTIC_RUN_ID="trainerkit",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT="1",  # never dialled: the group is started from the file
    )
    dist.init_process_group("gloo", init_method=f"file://{group}", rank=rank, world_size=world)


def leave_group() -> None:
    """End the process group and the torchrun variables: what runs next in this process is a single process."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    for name in TORCHRUN_ENV:
        os.environ.pop(name, None)


def spawn(fn, world: int, run: Path, *args) -> None:
    """``fn(rank, world, str(run), group, *args)`` in ``world`` fresh processes (spawned: nothing inherited);
    ``group``: a file of its own for join_group (a file store an earlier spawn left behind holds that group's
    addresses, and a new group reading them waits for ever)."""
    import secrets

    import torch.multiprocessing as tmp_mp

    run.mkdir(parents=True, exist_ok=True)
    group = run / f"group-{secrets.token_hex(8)}"
    tmp_mp.spawn(fn, args=(world, str(run), str(group), *args), nprocs=world, join=True)


def save(run: str, name: str, rank: int, value) -> None:
    Path(run, f"{name}-{rank}.json").write_text(json.dumps(value))


def load(run: Path, name: str, ranks: int) -> list:
    return [json.loads(Path(run, f"{name}-{r}.json").read_text()) for r in range(ranks)]


def once_each(keys: list[str], want: list[str]) -> str | None:
    """None if ``keys`` are ``want``, each once; else what differs."""
    if sorted(keys) == sorted(want):
        return None
    count = Counter(keys)
    twice = sorted(k for k, n in count.items() if n > 1)
    missing = sorted(set(want) - set(keys))
    extra = sorted(set(keys) - set(want))
    return f"{len(keys)} keys for {len(want)}: twice {twice[:4]}, missing {missing[:4]}, not in the split {extra[:4]}"
