"""cpus: the cores a process may use, its affinity and its cgroup CPU quota, on fake cgroup trees."""

from __future__ import annotations

from pathlib import Path

import pytest

from wds_tools.cpus import cgroup_cpu_limit, usable_cpus


def tree(root: Path, proc: str, files: dict[str, str]) -> tuple[Path, Path]:
    """A fake cgroup mount under ``root`` holding ``files`` (path -> text), and a /proc/self/cgroup of ``proc``."""
    mount = root / "cgroup"
    mount.mkdir(parents=True)
    for rel, text in files.items():
        (mount / rel).parent.mkdir(parents=True, exist_ok=True)
        (mount / rel).write_text(text)
    (root / "proc").write_text(proc)
    return mount, root / "proc"


CASES = [
    # docker --cpus=4 on cgroup v2: the container's own cgroup mounted as the root
    pytest.param("0::/\n", {"cpu.max": "400000 100000\n"}, 4.0, id="v2-container"),
    # a limit on the parent (a Kubernetes pod) and none on the process's own cgroup
    pytest.param(
        "0::/kubepods/pod1/c1\n",
        {"kubepods/pod1/cpu.max": "250000 100000\n", "kubepods/pod1/c1/cpu.max": "max 100000\n"},
        2.5,
        id="v2-parent-limit",
    ),
    pytest.param(
        "0::/a/b\n",
        {"a/cpu.max": "800000 100000\n", "a/b/cpu.max": "150000 100000\n"},
        1.5,
        id="v2-the-smallest-along-the-path",
    ),
    pytest.param("0::/\n", {"cpu.max": "max 100000\n"}, None, id="v2-no-quota"),
    # cgroup v1, the cpu controller mounted with cpuacct
    pytest.param(
        "12:memory:/docker/x\n4:cpu,cpuacct:/docker/x\n",
        {"cpu,cpuacct/docker/x/cpu.cfs_quota_us": "300000\n", "cpu,cpuacct/docker/x/cpu.cfs_period_us": "100000\n"},
        3.0,
        id="v1-cpu-cpuacct",
    ),
    pytest.param(
        "4:cpu,cpuacct:/docker/x\n",  # the container's cgroup is the mount's root: the path names the host's
        {"cpu,cpuacct/cpu.cfs_quota_us": "50000\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"},
        0.5,
        id="v1-container-root",
    ),
    pytest.param(
        "3:cpu:/\n",
        {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"},
        None,
        id="v1-no-quota",
    ),
    pytest.param("0::/\n", {"cpu.max": "lots\n"}, None, id="malformed"),
    pytest.param("", {}, None, id="no-cgroup"),
]


@pytest.mark.parametrize("proc, files, limit", CASES)
def test_the_cgroup_quota_is_read_from_v1_and_v2_trees(tmp_path, proc, files, limit):
    mount, proc_file = tree(tmp_path, proc, files)
    assert cgroup_cpu_limit(mount, proc_file) == limit


@pytest.mark.parametrize(
    "proc, files, affinity, cores",
    [
        ("0::/\n", {"cpu.max": "400000 100000\n"}, 64, 4),  # issue 38: docker --cpus=4 on a 64-core host
        ("0::/\n", {"cpu.max": "150000 100000\n"}, 64, 2),  # 1.5 CPUs: rounded up
        ("0::/\n", {"cpu.max": "20000 100000\n"}, 64, 1),  # a fifth of one: at least 1
        ("0::/\n", {"cpu.max": "400000 100000\n"}, 2, 2),  # taskset to 2 cores: the affinity is smaller
        ("0::/\n", {"cpu.max": "max 100000\n"}, 64, 64),
    ],
)
def test_usable_cpus_is_the_affinity_within_the_quota(tmp_path, monkeypatch, proc, files, affinity, cores):
    mount, proc_file = tree(tmp_path, proc, files)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(affinity)), raising=False)
    assert usable_cpus(cgroup_root=mount, proc_cgroup=proc_file) == cores
