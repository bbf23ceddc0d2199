"""The cores this process may use: how many threads and workers readers start by default.

Two limits apply: the CPU affinity (``taskset``, a cpuset: which cores the process may run on) and
the cgroup CPU quota (``docker run --cpus=4``, a Kubernetes CPU limit: how much CPU time it gets per
period, whatever the cores). A container limited to 4 CPUs on a 64-core host sees 64 cores in its
affinity; starting 32 workers there would only make them wait for each other.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

__all__ = ["usable_cpus", "cgroup_cpu_limit", "CGROUP_ROOT", "PROC_CGROUP"]

CGROUP_ROOT = "/sys/fs/cgroup"
"""Where the cgroup file systems are mounted (v2 unified, or one folder per v1 controller)."""
PROC_CGROUP = "/proc/self/cgroup"
"""This process's cgroups: ``hierarchy:controllers:path`` per line (``0::path`` for v2)."""


def usable_cpus(*, cgroup_root: str | os.PathLike = CGROUP_ROOT, proc_cgroup: str | os.PathLike = PROC_CGROUP) -> int:
    """The cores this process may use: its CPU affinity, no more than its cgroup CPU quota rounded up
    (``cgroup_cpu_limit``), at least 1."""
    if hasattr(os, "sched_getaffinity"):
        cores = len(os.sched_getaffinity(0)) or 1
    else:
        cores = os.cpu_count() or 1
    limit = cgroup_cpu_limit(cgroup_root, proc_cgroup)
    if limit is not None:
        cores = min(cores, math.ceil(limit))
    return max(1, cores)


def cgroup_cpu_limit(
    cgroup_root: str | os.PathLike = CGROUP_ROOT, proc_cgroup: str | os.PathLike = PROC_CGROUP
) -> float | None:
    """The CPUs the cgroup quotas give this process, quota / period: cgroup v2's ``cpu.max`` (``"400000
    100000"``; ``max``: none) and v1's ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (quota -1: none), the
    smallest over its cgroup and that cgroup's ancestors, as ``proc_cgroup`` names it under ``cgroup_root``
    (in a container whose cgroup is mounted as the root, the root's own files). None: no quota, or
    nothing readable (not Linux)."""
    root = Path(cgroup_root)
    limits = []
    for folder, kind in _cgroup_folders(root, Path(proc_cgroup)):
        got = _read_limit(folder, kind)
        if got is not None:
            limits.append(got)
    return min(limits) if limits else None


def _cgroup_folders(root: Path, proc: Path) -> list[tuple[Path, str]]:
    """(folder, "v1" or "v2") of this process's cgroup and its ancestors for the cpu controller, the
    mount's root last."""
    try:
        lines = proc.read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        lines = []
    out: list[tuple[Path, str]] = []
    mounts: list[tuple[Path, str, str]] = []  # (mount, path of this process's cgroup in it, kind)
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            mounts.append((root, path, "v2"))
        elif "cpu" in controllers.split(","):
            mounts += [(m, path, "v1") for m in _v1_cpu_mounts(root)]
    if not mounts:  # no /proc/self/cgroup: look at the mounts' roots only
        mounts = [(root, "/", "v2")] + [(m, "/", "v1") for m in _v1_cpu_mounts(root)]
    for mount, path, kind in mounts:
        here = mount / path.lstrip("/")
        chain = [here, *here.parents] if here.is_relative_to(mount) else []
        for folder in chain:
            if not folder.is_relative_to(mount):
                break
            if (folder, kind) not in out:
                out.append((folder, kind))
        if (mount, kind) not in out:  # a container's own cgroup mounted as the root, the path naming the host's
            out.append((mount, kind))
    return out


def _v1_cpu_mounts(root: Path) -> list[Path]:
    """The v1 hierarchies under ``root`` that hold the cpu controller (``cpu``, ``cpu,cpuacct``)."""
    try:
        return sorted(p for p in root.iterdir() if "cpu" in p.name.split(",") and p.is_dir())
    except OSError:
        return []


def _read_limit(folder: Path, kind: str) -> float | None:
    """The quota in ``folder`` (None: none, or no readable files)."""
    try:
        if kind == "v2":
            quota, period = (folder / "cpu.max").read_text().split()
            if quota == "max":
                return None
            q, p = int(quota), int(period)
        else:
            q = int((folder / "cpu.cfs_quota_us").read_text())
            p = int((folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return q / p if q > 0 and p > 0 else None
