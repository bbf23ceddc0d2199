"""One conversion in a fresh process, down the byte path or into the failure a test names.

A process with threads (a pytest-xdist worker runs its tests beside execnet's) gets a spawned pool,
without the shared memory forked workers use (runner._start_method); a fresh process with one
thread forks its pool, as the command does. ``run(spec)`` starts ``python tests/pooled.py SPEC`` and
returns what it printed: the start method, each size's counts, the byte paths its batches took and
what its progress bars were told, or the error's class and message. ``spec["runs"]``: several conversions one after the other in that
process (each with its own pool), one such answer each.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(spec: dict) -> dict:
    """Convert ``spec["manifest"]`` (or each of ``spec["runs"]``) in a fresh process (see ``main`` for the keys)."""
    p = subprocess.run(
        [sys.executable, __file__, json.dumps(spec)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )
    if p.returncode != 0:
        raise AssertionError(f"pooled.py exited {p.returncode}:\n{p.stderr}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def _configure(how: str | None) -> None:
    from wds_tools.convert import fragment, pipeline, runner, schedule, write

    if how == "no_shared":
        pipeline.shared_bytes = lambda workers: 0
    elif how == "small_slots":
        for mod in (fragment, write, schedule):
            # a 32 px sample takes 7,168 bytes of tar (4 headers, .cls, .i32, .json, .npy), with its 48 px
            # pixels and the 32 px spill 13,824: two fit at 32 px, one at 48,32, larger batches do not
            mod.SLOT_BYTES = 16 * 1024
    elif how == "two_slots":
        schedule.window = lambda workers: 1
    elif how == "spawn":
        runner._start_method = lambda: "spawn"


def _fail(where: str | None) -> None:
    """ENOSPC where the pool's writing meets shard train-000002 (set before the pool forks: workers inherit it)."""
    from wds_tools.convert import fragment, shard, spill, write
    from wds_tools.format.tarwrite import ShardWriter

    def enospc() -> OSError:
        return OSError(errno.ENOSPC, "No space left on device")

    def on_third(fn):
        def failing(*a, **kw):
            if any("train-000002" in str(x) for x in a):
                raise enospc()
            return fn(*a, **kw)

        return failing

    if where == "tar end":
        real_end = ShardWriter.end

        def end(self):
            if "train-000002" in self.path:
                raise enospc()
            return real_end(self)

        ShardWriter.end = end
    elif where == "worker write":  # alone, or riding on the next batch's call
        fragment.write_slots = on_third(fragment.write_slots)
        write.write_slots = fragment.write_slots
    elif where == "seal":
        shard.seal = on_third(shard.seal)
    elif where == "next shard's files":
        spill.SpillWriter.__init__ = on_third(spill.SpillWriter.__init__)


def _count_paths() -> dict[str, int]:
    """Batches placed from a slot of shared memory ("slot") and batches whose bytes came back with their
    result or were made here ("pipe"), counted as the converter's process takes them."""
    from wds_tools.convert.shard import ShardAssembler

    paths = {"slot": 0, "pipe": 0}
    for name, path in (("place", "slot"), ("append", "pipe")):
        real = getattr(ShardAssembler, name)

        def counted(self, *a, _real=real, _path=path, **kw):
            paths[_path] += 1
            return _real(self, *a, **kw)

        setattr(ShardAssembler, name, counted)
    return paths


def _watch_progress() -> list[dict]:
    """What the progress bar was told, per size: its total (the pending shards' samples), the samples it
    was advanced by, and whether a shard was done before the bar had counted it and the shards done before."""
    from wds_tools.convert import pipeline

    seen: list[dict] = []
    real = pipeline.write_shards

    def watched(tasks, runner, on_done, on_samples):
        bar = {"total": sum(len(t.samples) for t in tasks), "counted": 0, "past_total": False, "done_early": False}
        finished = [0]
        seen.append(bar)

        def samples(n):
            bar["counted"] += n
            bar["past_total"] |= bar["counted"] > bar["total"]
            on_samples(n)

        def done(task, meta):
            finished[0] += len(task.samples)
            bar["done_early"] |= bar["counted"] < finished[0]
            on_done(task, meta)

        return real(tasks, runner, done, samples)

    pipeline.write_shards = watched
    return seen


def _convert(spec: dict, paths: dict[str, int], bars: list[dict]) -> dict:
    from wds_tools.convert import convert, runner
    from wds_tools.errors import WdsToolsError

    paths.update(slot=0, pipe=0)
    bars.clear()
    method = runner._start_method()
    try:
        res = convert(
            spec["manifest"],
            version=spec["version"],
            size=spec["size"],
            out=spec["out"],
            workers=spec.get("workers"),
            progress=False,
            **spec.get("options", {}),
        )
    except WdsToolsError as e:
        return {"method": method, "error": type(e).__name__, "message": str(e)}
    keys = ("failed", "samples_written", "reused", "decoded", "decodes", "out_dir")
    results = [{k: getattr(r, k) for k in keys} for r in getattr(res, "results", [res])]
    return {"method": method, "results": results, "paths": dict(paths), "progress": list(bars)}


def main() -> None:
    """SPEC: manifest, out, version, size, workers (None: the default), options (convert's other
    keywords), how (a byte path: no_shared, small_slots, two_slots, spawn) and fail (a place for ENOSPC);
    or how, fail and runs, a list of (manifest, out, version, size, workers, options), converted in turn."""
    spec = json.loads(sys.argv[1])
    _configure(spec.get("how"))
    _fail(spec.get("fail"))
    paths, bars = _count_paths(), _watch_progress()
    if "runs" in spec:
        print(json.dumps({"runs": [_convert(one, paths, bars) for one in spec["runs"]]}))
    else:
        print(json.dumps(_convert(spec, paths, bars)))


if __name__ == "__main__":
    main()
