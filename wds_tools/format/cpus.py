"""The cores this process may use: how many threads and workers readers start by default."""

from __future__ import annotations

import os

__all__ = ["usable_cpus"]


def usable_cpus() -> int:
    """The cores this process may run on (its CPU affinity, e.g. under taskset or a cgroup), at least 1."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1
