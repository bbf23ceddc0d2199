"""Shared fixtures: small real corpora written as real JPEG files."""

from __future__ import annotations

import csv
import functools
import http.server
import io
import os
import threading
from pathlib import Path

import pytest

from wds_tools.synth import jpeg_bytes, photo_like


def write_manifest(path: Path, rows: list[dict], fields=("key", "path", "label", "split")) -> Path:
    fields = [f for f in fields if any(f in r for r in rows)]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    return path


def make_images(root: Path, n: int, *, classes=("a", "b", "c"), size=(96, 72), seed=0) -> list[dict]:
    """n small photo-like JPEGs under root/img/; returns manifest rows (no split column)."""
    rows = []
    (root / "img").mkdir(parents=True, exist_ok=True)
    for i in range(n):
        rel = f"img/s{i:04d}.jpg"
        (root / rel).write_bytes(jpeg_bytes(photo_like(*size, seed=seed * 7919 + i), quality=90))
        rows.append({"key": f"s{i:04d}", "path": rel, "label": classes[i % len(classes)]})
    return rows


def convert_images(
    root: Path, n: int, *, size: int, shard_size: int, val_every: int | None = None, **convert_options
) -> Path:
    """n photo-like JPEGs under root/c converted (one worker) into root/out/v1/<size>, which is returned.

    ``val_every``: every so many rows go to val (from row 0); otherwise ``convert_options`` may set
    ``val_fraction``.
    """
    from wds_tools.convert import convert

    rows = make_images(root / "c", n)
    if val_every:
        for i, r in enumerate(rows):
            r["split"] = "val" if i % val_every == 0 else "train"
    convert(
        write_manifest(root / "c" / "m.csv", rows),
        version="v1",
        size=size,
        out=root / "out",
        shard_size=shard_size,
        workers=1,
        progress=False,
        **convert_options,
    )
    return root / "out" / "v1" / str(size)


HAM_COLUMNS = ["lesion_id", "image_id", "dx", "dx_type", "age", "sex", "localization"]
ISIC_COLUMNS = [
    "image_name",
    "patient_id",
    "sex",
    "age_approx",
    "anatom_site_general_challenge",
    "diagnosis",
    "benign_malignant",
    "target",
]


def write_ham(root: Path, lesions: list[int], *, seed: int = 0) -> Path:
    """A HAM10000-shaped corpus: ``HAM10000_metadata.csv`` with one row per image, ``lesions[j]`` images of
    lesion j (its dx shared), JPEGs in ``images/<image_id>.jpg`` (image n's bytes depend on n and ``seed``
    only); ages with gaps (missing) and unicode sites. Returns the manifest."""
    (root / "images").mkdir(parents=True, exist_ok=True)
    dxs = ["nv", "mel", "bkl", "bcc"]
    sites = ["back", "lower extremity", "face", "épaule", "頭皮", "unknown"]
    rows, n = [], 0
    for j, count in enumerate(lesions):
        for _ in range(count):
            image = f"ISIC_{n:07d}"
            (root / "images" / f"{image}.jpg").write_bytes(
                jpeg_bytes(photo_like(40, 30, seed=seed * 7919 + n), quality=90)
            )
            rows.append(
                [
                    f"HAM_{j:07d}",
                    image,
                    dxs[j % len(dxs)],
                    ["histo", "follow_up", "consensus"][n % 3],
                    "" if n % 5 == 4 else f"{(n * 7) % 80 + 5}.0",
                    ["male", "female", "unknown"][n % 3],
                    sites[n % len(sites)],
                ]
            )
            n += 1
    path = root / "HAM10000_metadata.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(HAM_COLUMNS)
        w.writerows(rows)
    return path


def write_isic(root: Path, patients: list[int], *, seed: int = 1) -> Path:
    """An ISIC-2020-shaped corpus: ``train.csv`` (patients[j] images of patient j, some malignant), JPEGs in
    ``train/<image_name>.jpg``, empty sex/age/site cells as ISIC has them. Returns the manifest."""
    (root / "train").mkdir(parents=True, exist_ok=True)
    path = root / "train.csv"
    n = 0
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(ISIC_COLUMNS)
        for j, count in enumerate(patients):
            for _ in range(count):
                image = f"ISIC_{2_000_000 + n}"
                (root / "train" / f"{image}.jpg").write_bytes(
                    jpeg_bytes(photo_like(36, 36, seed=seed * 7919 + n), quality=90)
                )
                malignant = n % 4 == 1
                w.writerow(
                    [
                        image,
                        f"IP_{1000 + j}",
                        "" if n % 6 == 5 else ["male", "female"][j % 2],
                        "" if n % 6 == 5 else f"{30 + 5 * (j % 10)}.0",
                        "" if n % 7 == 3 else ["torso", "lower extremity", "head/neck"][n % 3],
                        "melanoma" if malignant else "nevus",
                        "malignant" if malignant else "benign",
                        int(malignant),
                    ]
                )
                n += 1
    return path


@pytest.fixture
def interrupt_writes(monkeypatch):
    """interrupt_writes(n): in-process conversions write n shards, then get a KeyboardInterrupt
    as the next shard is opened.

    Returns the list the written shard names are appended to; call ``.restore()`` on it
    (or let the fixture end) to write normally again.
    """
    import wds_tools.convert.write as write_mod

    real = write_mod.open_shard

    class Written(list):
        def restore(self) -> None:
            monkeypatch.setattr(write_mod, "open_shard", real)

    def arm(n: int) -> Written:
        written = Written()

        def flaky(task):
            if len(written) == n:
                raise KeyboardInterrupt
            written.append(task.name)
            return real(task)

        monkeypatch.setattr(write_mod, "open_shard", flaky)
        return written

    return arm


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """A manifest of 40 good JPEGs in 3 classes, splits from the key hash."""
    root = tmp_path / "corpus"
    rows = make_images(root, 40)
    return write_manifest(root / "manifest.csv", rows)


# ------------------------------------------------------------------ servers: S3 (moto) and plain http


@pytest.fixture(scope="module")
def s3_server():
    """moto's S3 server in a thread; AWS_* variables point every client at it."""
    import logging

    from moto.server import ThreadedMotoServer

    from wds_tools.format import transport

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    saved = {
        k: os.environ.get(k)
        for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL")
    }
    os.environ.update(
        AWS_ACCESS_KEY_ID="test",
        AWS_SECRET_ACCESS_KEY="test",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_ENDPOINT_URL=f"http://{host}:{port}",
    )
    transport._filesystem.cache_clear()
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    yield f"http://{host}:{port}"
    server.stop()
    transport._filesystem.cache_clear()
    s3fs.S3FileSystem.clear_instance_cache()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def upload(fs, folder: Path, url: str, skip=()) -> str:
    """Put every file of ``folder`` (but ``skip``) under ``url`` with fsspec ``fs``; returns ``url``."""
    for p in sorted(folder.iterdir()):
        if p.is_file() and p.name not in skip:
            fs.put_file(str(p), f"{url}/{p.name}")
    return url


@pytest.fixture
def bucket(s3_server, request):
    """A fresh bucket per test: s3://<name>."""
    import s3fs

    name = request.node.name.lower().replace("_", "-")[:50].strip("-")
    fs = s3fs.S3FileSystem()
    fs.mkdir(name)
    return fs, f"s3://{name}"


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # one stderr line per request otherwise
        pass


class _RangeHandler(_QuietHandler):
    """Answers ``Range: bytes=A-B`` with 206 and those bytes, as object stores and most web servers do
    (``SimpleHTTPRequestHandler`` ignores the header and sends the whole file)."""

    def send_head(self):
        wanted = self.headers.get("Range")
        if not wanted:
            return super().send_head()
        try:
            with open(self.translate_path(self.path), "rb") as f:
                data = f.read()
        except OSError:
            self.send_error(404)
            return None
        a, _, b = wanted.removeprefix("bytes=").partition("-")
        start, end = int(a), min(int(b) if b else len(data) - 1, len(data) - 1)
        if start >= len(data):
            self.send_error(416)
            return None
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        self.send_header("Content-Length", str(end - start + 1))
        self.end_headers()
        return io.BytesIO(data[start : end + 1])


@pytest.fixture
def serve_http():
    """serve_http(folder, ranges=False) -> ``http://127.0.0.1:<port>``: a threaded http.server over
    ``folder``; with ``ranges`` it answers Range requests (206), else it sends whole files."""
    servers = []

    def start(folder: Path, *, ranges: bool = False) -> str:
        handler = functools.partial(_RangeHandler if ranges else _QuietHandler, directory=str(folder))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()
