"""One conversion in a fresh process, down the byte path or into the failure a test names.

A process with threads (a pytest-xdist worker runs its tests beside execnet's) gets a spawned pool,
without the shared memory forked workers use (runner._start_method); a fresh process with one
thread forks its pool, as the command does. ``run(spec)`` starts ``python tests/pooled.py SPEC`` and
returns what it printed: the start method and each size's counts, or the error's class and message.
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
    """Convert ``spec["manifest"]`` in a fresh process (see ``main`` for the keys)."""
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
            mod.SLOT_BYTES = 6 * 1024  # one 32 px sample fits (4,608 bytes of pixels), two do not
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


def main() -> None:
    """SPEC: manifest, out, version, size, workers (None: the default), options (convert's other
    keywords), how (a byte path: no_shared, small_slots, two_slots, spawn) and fail (a place for ENOSPC)."""
    spec = json.loads(sys.argv[1])
    _configure(spec.get("how"))
    _fail(spec.get("fail"))
    from wds_tools.convert import convert, runner
    from wds_tools.errors import WdsToolsError

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
        print(json.dumps({"method": method, "error": type(e).__name__, "message": str(e)}))
        return
    keys = ("failed", "samples_written", "reused", "decoded", "decodes", "out_dir")
    results = [{k: getattr(r, k) for k in keys} for r in getattr(res, "results", [res])]
    print(json.dumps({"method": method, "results": results}))


if __name__ == "__main__":
    main()
