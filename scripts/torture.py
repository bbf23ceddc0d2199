"""Interruption and concurrency trials of ``wds-tools convert`` on a generated corpus.

Every trial runs the real CLI in its own process (session) on a corpus of photo-like JPEGs, does
something an unlucky operator would, and then checks the output folder: ``wds-tools verify``
exits 0, and every file (hidden ones included) is byte-identical to a clean, uninterrupted run of
the command that finished there. Trials:

- kill -9 of the convert at random points (single-size and ``--size 224,64`` runs), then the same
  command again; after each kill the caller's stdout/stderr pipes must reach EOF and no process of
  the convert's session may be left within 5 s (no orphaned pool worker or resource tracker);
- SIGINT (Ctrl-C) at random points: exit 130 or a finished run, then the same command again;
- SIGINT and SIGTERM to the main pid alone (as ``timeout -s INT``, a supervisor or SLURM send them),
  and to the whole group: within 10 s exit 130 / 143 with the "run the same command again to
  resume" line and no traceback (or a finished run), no process left, and the rerun byte-identical;
  the command is the ``wds-tools`` console script users run. A signal in the interpreter's own
  start-up (about 50 ms, before ``wds_tools.__main__`` installs the handlers) meets Python's
  default action (SIGTERM: killed with no line; SIGINT: KeyboardInterrupt): passed only when
  nothing was written, and marked "in the interpreter's start-up" in the table;
- two converts started together (or one a random moment after the other) into the same folder,
  with the same options or with different ones (``--shard-size``, ``--resize``, a multi-size run
  against a single size): each one either finishes, or is refused with a message (exit 1, no
  traceback), the folder ends equal to the clean run of the command that finished, and the
  refused command, run again afterwards, changes nothing (same options: "already converted");
- disk full (as root only): the output on a small tmpfs; the convert must fail with one line
  naming the folder, leave no partial file, and resume byte-identically once the tmpfs is grown;
- killed incremental runs: v2 (12 added, 6 removed, 6 changed, 6 relabeled) built on v1 is
  killed at a random point and run again; v2 must equal a full conversion of v2, v1 untouched.

Prints a table of trials and outcomes; exits 1 if any trial failed.

    .venv/bin/python scripts/torture.py                      # 600 images, 12 shards, >= 20 kills, 10 pairs
    .venv/bin/python scripts/torture.py --images 120 --kills 4 --pairs 2 --signals 2 --incremental 1
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from wds_tools.synth import jpeg_bytes, photo_like  # noqa: E402

CLASSES = ("nv", "mel", "bkl", "bcc", "akiec")


# ------------------------------------------------------------------ corpus


def make_corpus(root: Path, n: int, width: int, height: int, seed: int) -> tuple[Path, Path]:
    """n photo-like JPEGs; v1.csv (all) and v2.csv (2% added, 1% removed, 1% changed, 1% relabeled);
    every 10th row in split val."""
    img = root / "img"
    img.mkdir(parents=True, exist_ok=True)
    extra = max(2, n // 50)
    rows = []
    for i in range(n + extra):
        p = img / f"p{i:05d}.jpg"
        if not p.exists():
            p.write_bytes(jpeg_bytes(photo_like(width, height, seed=seed * 100003 + i), quality=90))
        rows.append((f"p{i:05d}", f"img/{p.name}", CLASSES[i % len(CLASSES)], "val" if i % 10 == 9 else "train"))
    v1 = _write(root / "v1.csv", rows[:n])
    churn = max(1, n // 100)
    v2_rows = list(rows[churn:n]) + rows[n:]  # the first `churn` removed, `extra` added
    for j in range(churn, 2 * churn):  # changed: another picture under a new path
        k, _, label, split = v2_rows[j]
        p = img / f"changed-{k}.jpg"
        if not p.exists():
            p.write_bytes(jpeg_bytes(photo_like(width, height, seed=seed * 100003 + 7_000_000 + j), quality=90))
        v2_rows[j] = (k, f"img/{p.name}", label, split)
    for j in range(2 * churn, 3 * churn):  # relabeled
        k, path, label, split = v2_rows[j]
        v2_rows[j] = (k, path, CLASSES[(CLASSES.index(label) + 1) % len(CLASSES)], split)
    v2 = _write(root / "v2.csv", v2_rows)
    return v1, v2


def _write(path: Path, rows) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["key", "path", "label", "split"])
        w.writerows(rows)
    return path


# ------------------------------------------------------------------ running the CLI


def cli(*args: str) -> list[str]:
    """The ``wds-tools`` console script beside this interpreter (what users run), else ``-m wds_tools``;
    either imports the package from REPO (``env``'s PYTHONPATH comes first)."""
    script = Path(sys.executable).with_name("wds-tools")
    if script.exists():
        return [str(script), *args]
    return [sys.executable, "-m", "wds_tools", *args]


def before_python_ran_ours(code: int, sig: int, err: str) -> bool:
    """The signal came during the interpreter's own start-up (about 50 ms: site, the launcher),
    before ``wds_tools.__main__`` installed its handlers: Python's defaults act. SIGTERM kills
    the process with no line (exit -15); SIGINT raises KeyboardInterrupt, which our handler never
    raises (it raises ``Interrupted``), so a KeyboardInterrupt in stderr proves the handler was not
    in yet, and a "Fatal Python error" names the start-up step it stopped."""
    if code == -sig and not err.strip():
        return True
    return sig == signal.SIGINT and code in (1, -signal.SIGINT) and err.rstrip().endswith("KeyboardInterrupt")


def env() -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO)}


@dataclass
class Opts:
    """One convert command, minus --out."""

    name: str
    manifest: Path
    version: str = "v1"
    size: str = "224"
    extra: tuple[str, ...] = ()

    def command(self, out: Path, workers: int) -> list[str]:
        return cli(
            "convert",
            "--source",
            str(self.manifest),
            "--version",
            self.version,
            "--size",
            self.size,
            "--out",
            str(out),
            "--workers",
            str(workers),
            "--quiet",
            *self.extra,
        )

    def folders(self, out: Path) -> list[Path]:
        return [out / self.version / s for s in self.size.split(",")]


def run(cmd: list[str], timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env(), cwd=REPO)


def session_alive(sid: int) -> list[int]:
    """Processes of session ``sid`` that are not zombies."""
    alive = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[3]) == sid and fields[0] not in "ZX":
            alive.append(int(entry))
    return alive


class Started:
    """A convert started in its own session, its stdout and stderr read into memory as they come."""

    def __init__(self, cmd: list[str]):
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env(), cwd=REPO, start_new_session=True
        )
        self.out, self.err = b"", b""
        self.open = {self.proc.stdout.fileno(): "out", self.proc.stderr.fileno(): "err"}

    def pump(self, timeout: float) -> None:
        """Read what is there for up to ``timeout`` seconds (until both pipes are at EOF)."""
        end = time.perf_counter() + timeout
        while self.open and time.perf_counter() < end:
            ready, _, _ = select.select(list(self.open), [], [], max(0.0, min(0.1, end - time.perf_counter())))
            for fd in ready:
                data = os.read(fd, 1 << 16)
                if not data:
                    del self.open[fd]
                elif self.open[fd] == "out":
                    self.out += data
                else:
                    self.err += data

    def wait(self, timeout: float = 900) -> int:
        self.pump(timeout)
        return self.proc.wait(timeout=30)

    def kill_and_check(self, sig: int, group: bool = False) -> tuple[bool, str]:
        """Send ``sig`` to the main pid (or its whole process ``group``); (ok, note): the pipes reach
        EOF (within 10 s for a signal the command handles) and the session empties within 5 s more."""
        if self.proc.poll() is not None:
            self.pump(5)
            return True, "had finished"
        if group:
            os.killpg(self.proc.pid, sig)
        else:
            self.proc.send_signal(sig)
        t = time.perf_counter()
        self.pump(5 if sig == signal.SIGKILL else 60)
        eof = time.perf_counter() - t
        if self.open or eof > 10:
            stuck = f"still running {eof:.1f} s after the signal" if self.open else f"exited {eof:.1f} s after it"
            if self.open:
                self.proc.kill()
                self.pump(5)
            self.proc.wait(timeout=60)
            for pid in session_alive(self.proc.pid):
                os.kill(pid, signal.SIGKILL)
            return False, stuck
        self.proc.wait(timeout=60)
        while session_alive(self.proc.pid) and time.perf_counter() - t < 5:
            time.sleep(0.05)
        left = session_alive(self.proc.pid)
        for pid in left:  # do not let a failed trial poison the next ones
            os.kill(pid, signal.SIGKILL)
        if self.open:
            return False, f"pipes still open after {eof:.1f} s (held by {left})"
        if left:
            return False, f"processes left: {left}"
        return True, f"pipes EOF in {eof:.2f} s, no process left"


# ------------------------------------------------------------------ checks


def digest_tree(folder: Path) -> dict[str, str]:
    """relative path -> sha256 of every file under ``folder``, hidden ones included."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def check_folder(folder: Path, ref: dict[str, str]) -> tuple[bool, str]:
    v = run(cli("verify", str(folder), "--no-stats"))
    if v.returncode != 0:
        return False, f"verify exit {v.returncode}: {(v.stdout + v.stderr).strip()[-300:]}"
    got = digest_tree(folder)
    if got != ref:
        diff = sorted(set(got) ^ set(ref)) + sorted(k for k in set(got) & set(ref) if got[k] != ref[k])
        return False, f"bytes differ from the clean run: {diff[:6]}"
    return True, "verify ok, bytes equal"


def traceback_in(text: str) -> bool:
    return "Traceback" in text


@dataclass
class Trial:
    kind: str
    what: str
    outcome: str
    ok: bool


# ------------------------------------------------------------------ trials


class Torture:
    def __init__(self, args):
        self.args, self.rng = args, random.Random(args.seed)
        self.work = Path(args.work)
        self.trials: list[Trial] = []
        self.refs: dict[str, dict[Path, dict[str, str]]] = {}  # opts name -> size folder -> digests
        self.clean_seconds: dict[str, float] = {}
        self.n = 0

    def out(self, tag: str) -> Path:
        self.n += 1
        path = self.work / "trials" / f"{self.n:03d}-{tag}"
        shutil.rmtree(path, ignore_errors=True)
        return path

    def record(self, kind: str, what: str, outcome: str, ok: bool, stderr: str = "") -> None:
        self.trials.append(Trial(kind, what, outcome, ok))
        if not ok and stderr:  # the whole stderr of a failed trial, for the one who debugs it
            kept = self.work / "failures" / f"{len(self.trials):03d}.txt"
            kept.parent.mkdir(parents=True, exist_ok=True)
            kept.write_text(f"{kind}: {what}\n{outcome}\n\n{stderr}")
            outcome += f" (stderr in {kept})"
        print(f"  [{'ok' if ok else 'FAIL'}] {kind}: {what} -> {outcome}", flush=True)

    def reference(self, opts: Opts) -> None:
        out = self.work / "refs" / opts.name
        shutil.rmtree(out, ignore_errors=True)
        t = time.perf_counter()
        r = run(opts.command(out, self.args.workers))
        self.clean_seconds[opts.name] = time.perf_counter() - t
        if r.returncode != 0:
            raise SystemExit(f"clean run {opts.name} failed: {r.stderr}")
        self.refs[opts.name] = {Path(f.name): digest_tree(f) for f in opts.folders(out)}
        shards = sum(1 for f in opts.folders(out) for _ in f.glob("*.tar"))
        print(f"clean run {opts.name}: {self.clean_seconds[opts.name]:.1f} s, {shards} shards", flush=True)

    def check(self, opts: Opts, out: Path) -> tuple[bool, str]:
        notes = []
        for folder in opts.folders(out):
            ok, note = check_folder(folder, self.refs[opts.name][Path(folder.name)])
            if not ok:
                return False, f"{folder.name}: {note}"
            notes.append(note)
        return True, notes[0]

    # -- kill -9 / SIGINT, then the same command

    def interrupt(self, opts: Opts, sig: int, kind: str, group: bool = False) -> None:
        out = self.out(kind.replace(" ", ""))
        cmd = opts.command(out, self.args.workers)
        at = self.rng.uniform(0.0, 0.95 * self.clean_seconds[opts.name])
        p = Started(cmd)
        p.pump(at)
        state = _state(opts.folders(out))
        ok, note = p.kill_and_check(sig, group)
        name = signal.Signals(sig).name
        what = f"{opts.name}, {name} to the {'group' if group else 'main pid'} at {at:.2f} s ({state})"
        if not ok:
            return self.record(kind, what, note, False)
        code = p.proc.returncode
        err = p.err.decode(errors="replace")
        early = sig != signal.SIGKILL and before_python_ran_ours(code, sig, err) and not out.exists()
        if early:  # the interpreter's start-up, before wds-tools' handlers: Python's default action
            note += "; in the interpreter's start-up (Python's default action), nothing written"
        elif sig != signal.SIGKILL:  # handled: exit 128 + sig with the resume line, or a finished run
            if code not in (0, 128 + sig):
                return self.record(kind, what, f"exit {code} after {name}: {err[-200:]}", False, err)
            if code and "run the same command again to resume" not in err:
                return self.record(kind, what, f"no resume line after {name}: {err[-200:]}", False)
            if traceback_in(err):
                return self.record(kind, what, f"traceback after {name}: {err[-300:]}", False, err)
        again = run(cmd)
        if again.returncode != 0:
            return self.record(kind, what, f"rerun exit {again.returncode}: {again.stderr.strip()[-300:]}", False)
        ok, check = self.check(opts, out)
        resumed = _resumed(again.stdout)
        self.record(kind, what, f"{note}; rerun exit 0{resumed}; {check}", ok)
        shutil.rmtree(out, ignore_errors=True)

    # -- two converts into one folder

    def pair(self, a: Opts, b: Opts) -> None:
        out = self.out("pair")
        delay = 0.0 if self.rng.random() < 0.3 else self.rng.uniform(0.0, 0.8 * self.clean_seconds[a.name])
        pa = Started(a.command(out, self.args.workers))
        pa.pump(delay)
        pb = Started(b.command(out, self.args.workers))
        codes = {}
        for name, p in (("A", pa), ("B", pb)):
            codes[name] = p.wait()
        errs = {"A": pa.err.decode(errors="replace"), "B": pb.err.decode(errors="replace")}
        outs = {"A": pa.out.decode(errors="replace"), "B": pb.out.decode(errors="replace")}
        what = f"A={a.name} B={b.name}, B {delay:.2f} s after A"
        cmds = {"A": a, "B": b}
        # the same folder made with the same options by both (a multi-size run shares 224 with a single one)
        compatible = (a.manifest, a.version, a.extra) == (b.manifest, b.version, b.extra)
        problems = [f"{n} traceback" for n in "AB" if traceback_in(errs[n])]
        finished = [n for n in "AB" if codes[n] == 0]
        refused = {n: _why(errs[n]) for n in "AB" if codes[n] != 0}
        problems += [
            f"{n} exit {codes[n]} without a refusal: {errs[n].strip()[-200:]}" for n in refused if refused[n] is None
        ]
        if not finished:
            problems.append("neither finished")
        if len(finished) == 2 and not compatible:
            problems.append("both exited 0 with different options into one folder")
        for n in finished if not problems else []:
            ok, check = self.check(cmds[n], out)
            if not ok:
                problems.append(f"{n}'s folders: {check}")
        for n in refused if not problems else []:  # the refused command again, once the other has finished
            done = {f: digest_tree(f) for m in finished for f in cmds[m].folders(out)}
            again = run(cmds[n].command(out, self.args.workers))
            if compatible:
                if again.returncode != 0:
                    problems.append(f"{n} again: exit {again.returncode} {again.stderr.strip()[-200:]}")
                elif a.size == b.size and "already converted" not in again.stdout:
                    problems.append(f"{n} again did not find the folder complete: {again.stdout[-200:]}")
                else:
                    ok, check = self.check(cmds[n], out)
                    if not ok:
                        problems.append(f"{n} again: {check}")
            elif again.returncode == 0 or _why(again.stderr) != "other options":
                problems.append(f"{n} again with other options: exit {again.returncode} {again.stderr[-200:]}")
            if {f: digest_tree(f) for f in done} != done:
                problems.append(f"{n} again changed a finished folder")
        outcome = ", ".join(
            f"{n}: " + ("exit 0" + _resumed(outs[n]) if codes[n] == 0 else f"refused ({refused[n]})") for n in "AB"
        )
        self.record(
            "concurrent",
            what,
            "; ".join(problems)
            or f"{outcome}; verify ok, bytes equal; the refused command run again "
            + ("finished or found it complete" if compatible else "refused again"),
            not problems,
        )
        shutil.rmtree(out, ignore_errors=True)

    # -- disk full on a small tmpfs

    def disk_full(self, opts: Opts, fraction: float) -> None:
        if os.geteuid() != 0:
            return self.record("disk full", opts.name, "skipped: mounting a tmpfs needs root", True)
        mnt = self.out("diskfull")
        mnt.mkdir(parents=True)
        ref_bytes = sum(
            p.stat().st_size for f in opts.folders(self.work / "refs" / opts.name) for p in f.rglob("*") if p.is_file()
        )
        size_kb = max(64, int(ref_bytes * fraction / 1024))
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(mnt)], capture_output=True, text=True
        )
        if r.returncode != 0:
            return self.record("disk full", opts.name, f"skipped: {r.stderr.strip()}", True)
        what = f"{opts.name} on a {size_kb} KiB tmpfs ({fraction:.0%} of its output)"
        try:
            out = mnt / "shards"
            first = run(opts.command(out, self.args.workers))
            msg = first.stderr.strip()
            problems = []
            if first.returncode == 0:
                problems.append("finished on a disk too small")
            elif not msg.startswith("Error: No space left on device writing ") or "\n" in msg or traceback_in(msg):
                problems.append(f"message: {msg[-300:]}")
            partial = [str(p) for p in mnt.rglob("*") if ".partial-" in p.name or ".tmp-" in p.name]
            if partial:
                problems.append(f"partial files left: {partial[:3]}")
            kept = sum(1 for f in opts.folders(out) for _ in f.glob("*.tar"))
            subprocess.run(["mount", "-o", f"remount,size={int(ref_bytes * 3 / 1024) + 1024}k", str(mnt)], check=True)
            again = run(opts.command(out, self.args.workers))
            if again.returncode != 0:
                problems.append(f"rerun exit {again.returncode}: {again.stderr[-200:]}")
            else:
                ok, check = self.check(opts, out)
                if not ok:
                    problems.append(check)
            needed = msg.split("needs ", 1)[-1].split(" (", 1)[0] if "needs " in msg else "?"
            self.record(
                "disk full",
                what,
                "; ".join(problems)
                or f"exit 1, one line: needs {needed}; no partial file; {kept} shards kept; after growing "
                f"the tmpfs the rerun resumed{_resumed(again.stdout)}; verify ok, bytes equal",
                not problems,
            )
        finally:
            subprocess.run(["umount", "-l", str(mnt)], check=False)
            shutil.rmtree(mnt, ignore_errors=True)

    # -- killed incremental runs

    def incremental(self, v1: Opts, v2: Opts) -> None:
        out = self.out("incremental")
        base = out / "v1"
        shutil.copytree(self.work / "refs" / v1.name / "v1", base)
        base_digest = digest_tree(base)
        cmd = v2.command(out, self.args.workers)
        at = self.rng.uniform(0.0, 1.05 * self.clean_seconds["v2-incremental"])
        p = Started(cmd)
        p.pump(at)
        state = _state(v2.folders(out))
        ok, note = p.kill_and_check(signal.SIGKILL)
        what = f"v2 on v1, SIGKILL at {at:.2f} s ({state})"
        if not ok:
            return self.record("killed incremental", what, note, False)
        again = run(cmd)
        problems = []
        if again.returncode != 0:
            problems.append(f"rerun exit {again.returncode}: {again.stderr[-200:]}")
        else:
            ok, check = self.check(v2, out)  # the clean incremental v2, whose data equal the full v2's
            if not ok:
                problems.append(check)
        if digest_tree(base) != base_digest:
            problems.append("v1 (the base) changed")
        self.record(
            "killed incremental",
            what,
            "; ".join(problems)
            or f"{note}; rerun exit 0{_resumed(again.stdout)}; equal to the clean v2 (its shards and "
            "samples.npz to a full conversion's); v1 untouched",
            not problems,
        )
        shutil.rmtree(out, ignore_errors=True)


def _state(folders: list[Path]) -> str:
    tars = sum(1 for f in folders for _ in f.glob("*.tar"))
    done = sum(1 for f in folders if (f / "index.json").exists())
    return f"{tars} shards, {done}/{len(folders)} indexes"


def _resumed(stdout: str) -> str:
    if "already converted" in stdout:
        return ", already converted"
    kept = [line for line in stdout.splitlines() if "kept from an interrupted run" in line]
    return ", resumed" if kept else ""


def _why(stderr: str) -> str | None:
    """Why a convert was refused: the lock, or a finished folder made with other options. An
    unfinished folder "made with other options" cannot be met in a pair whose other run finished:
    the lock should have refused it, so that is no valid reason (None)."""
    for needle, short in (
        ("is being written by another conversion", "folder locked by the other run"),
        ("already holds a conversion made with other options", "other options"),
    ):
        if needle in stderr:
            return short
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=600, help="images in v1 (default 600)")
    ap.add_argument("--shards", type=int, default=12, help="shards of the default run (default 12)")
    ap.add_argument("--photo", default="1600x1200", help="source picture size WxH (default 1600x1200)")
    ap.add_argument("--kills", type=int, default=20, help="kill -9 trials of v1 (default 20; 1 in 4 multi-size)")
    ap.add_argument("--sigints", type=int, default=3, help="SIGINT trials (default 3)")
    ap.add_argument(
        "--signals",
        type=int,
        default=10,
        help="SIGINT and SIGTERM (alternately) to the main pid alone, then the same command (default 10)",
    )
    ap.add_argument(
        "--group-signals",
        type=int,
        default=4,
        help="SIGINT and SIGTERM (alternately) to the whole process group (default 4)",
    )
    ap.add_argument("--pairs", type=int, default=10, help="concurrent pairs (default 10)")
    ap.add_argument("--incremental", type=int, default=4, help="killed incremental runs (default 4)")
    ap.add_argument("--workers", type=int, default=2, help="--workers of every convert (default 2)")
    ap.add_argument(
        "--only",
        default="kill,sigint,signal,concurrent,diskfull,incremental",
        help="trial kinds to run, comma-separated (default: all)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", default="/tmp/wds-torture", help="corpus and trial folders (default /tmp/wds-torture)")
    args = ap.parse_args()
    if not sys.platform.startswith("linux"):
        raise SystemExit("torture.py reads /proc to find leftover processes: Linux only")
    width, height = (int(x) for x in args.photo.lower().split("x"))
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    v1m, v2m = make_corpus(work / "corpus", args.images, width, height, args.seed)
    print(
        f"corpus: {args.images} JPEGs of {width}x{height} in {work / 'corpus'} ({time.perf_counter() - t0:.0f} s)",
        flush=True,
    )
    val = sum(1 for i in range(args.images) if i % 10 == 9)  # the manifests' split column: every 10th row
    per_shard = -(-args.images // args.shards)  # the smallest --shard-size giving at most --shards shards
    while -(-(args.images - val) // per_shard) + -(-val // per_shard) > args.shards:
        per_shard += 1
    default = Opts("default", v1m, extra=("--shard-size", str(per_shard)))
    smaller = Opts("shard-size", v1m, extra=("--shard-size", str(max(1, per_shard * 3 // 4))))
    squash = Opts("squash", v1m, extra=("--shard-size", str(per_shard), "--resize", "squash"))
    multi = Opts("multi-size", v1m, size="224,64", extra=("--shard-size", str(per_shard)))
    v2_full = Opts("v2-full", v2m, version="v2", extra=("--shard-size", str(per_shard), "--no-reuse"))
    v2 = Opts("v2-incremental", v2m, version="v2", extra=("--shard-size", str(per_shard)))
    t = Torture(args)
    for o in (default, smaller, squash, multi, v2_full):
        t.reference(o)
    # v2's reference is the full conversion; its clean incremental time sets the kill window
    out = work / "refs" / "v2-incremental"
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(work / "refs" / "default" / "v1", out / "v1")
    s = time.perf_counter()
    r = run(v2.command(out, args.workers))
    t.clean_seconds["v2-incremental"] = time.perf_counter() - s
    incremental = digest_tree(out / "v2" / "224")
    full = t.refs["v2-full"][Path("224")]
    data = {k for k in full if k != "index.json"}  # index.json records the base (build.base)
    if r.returncode != 0 or {k: incremental.get(k) for k in data} != {k: full[k] for k in data}:
        raise SystemExit(f"the clean incremental v2 differs from the full one: {r.stderr}")
    t.refs["v2-incremental"] = {Path("224"): incremental}
    print(
        f"clean incremental v2: {t.clean_seconds['v2-incremental']:.1f} s, shards and samples.npz equal to "
        "the full v2's",
        flush=True,
    )

    only = set(args.only.split(","))
    for i in range(args.kills if "kill" in only else 0):
        t.interrupt(multi if i % 4 == 3 else default, signal.SIGKILL, "kill -9")
    for _i in range(args.sigints if "sigint" in only else 0):
        t.interrupt(default, signal.SIGINT, "SIGINT")
    for i in range(args.signals if "signal" in only else 0):  # main pid alone, SIGINT and SIGTERM in turn
        t.interrupt(default, (signal.SIGINT, signal.SIGTERM)[i % 2], "signal")
    for i in range(args.group_signals if "signal" in only else 0):
        t.interrupt(default, (signal.SIGINT, signal.SIGTERM)[i % 2], "group signal", group=True)
    combos = [
        (default, default),
        (default, smaller),
        (default, squash),
        (smaller, default),
        (squash, default),
        (default, multi),
        (multi, default),
        (multi, multi),
        (smaller, squash),
        (default, default),
    ]
    for i in range(args.pairs if "concurrent" in only else 0):
        a, b = combos[i % len(combos)]
        t.pair(a, b)
    if "diskfull" in only:
        t.disk_full(default, 0.5)
        t.disk_full(multi, 0.4)
    for _ in range(args.incremental if "incremental" in only else 0):
        t.incremental(default, v2)

    print()
    print("| # | trial | what | outcome |")
    print("|---|---|---|---|")
    for i, tr in enumerate(t.trials, 1):
        print(f"| {i} | {tr.kind} | {tr.what} | {'PASS' if tr.ok else 'FAIL'}: {tr.outcome} |")
    failed = [tr for tr in t.trials if not tr.ok]
    by_kind: dict[str, list[int]] = {}
    for tr in t.trials:
        by_kind.setdefault(tr.kind, [0, 0])[0 if tr.ok else 1] += 1
    print()
    print(", ".join(f"{k}: {v[0]} passed, {v[1]} failed" for k, v in by_kind.items()))
    print(
        f"{len(t.trials) - len(failed)} of {len(t.trials)} trials passed in {time.perf_counter() - t0:.0f} s "
        f"({args.images} images, {args.workers} workers, seed {args.seed})"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
