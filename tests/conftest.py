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


def once_per_run(tmp_path_factory, name: str, make):
    """``make(folder)``'s result, computed once per test run: under pytest-xdist the first worker to ask makes it
    (in a folder of the run's shared base temp) and pickles it; the others wait for that pickle and read it.

    For a module fixture whose tests land on several workers (a LONG_FIRST test starts on one worker, the rest of
    its module runs on the other) and that costs seconds of CPU per copy. The value must be picklable.
    """
    import fcntl
    import pickle

    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return make(tmp_path_factory.mktemp(name))
    shared = tmp_path_factory.getbasetemp().parent  # every worker's base temp is a folder of this one
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the others wait here while the first makes it
        done = shared / f"{name}.pickle"
        if not done.exists():
            folder = shared / f"{name}-made"
            folder.mkdir()
            data = pickle.dumps(make(folder))
            (shared / f"{name}.pickle.tmp").write_bytes(data)
            os.replace(shared / f"{name}.pickle.tmp", done)
        return pickle.loads(done.read_bytes())


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

    from wds_tools.storage import transport

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


# --- make test-fast: which tests are slow --------------------------------------------------------
# `make test-fast` (-m "not slow") leaves out the tests listed here; `make test` runs them all. Rule: a test
# function is slow when one of its cases took 1 s or more (setup + call + teardown) in
# `pytest -p no:cacheprovider --durations=0` over the whole suite (2-core VM under load 4-7 from other
# work: 1121 tests, 849 s, 2026-11-25), or 0.75 s or more in the same measurement of the fast set that
# was left ("# in the fast run"). The number is that slowest case in seconds. Wall time on a shared VM
# swings with the load, so a test is also slow when a case takes 0.5 s of CPU or more (this process and
# its waited children, setup + call + teardown; "# ... s CPU in the fast run": `make test-fast` with a
# per-test getrusage plugin, 2026-11-27, 1069 tests, 76 s of CPU in all before these were marked, 61 s
# after). Not counted, since the
# cost would only move: a module fixture's first setup (it falls on the next test using it), and a stall
# of 5-20 s a test suffers for an earlier one (a DataLoader's workers shut down by the garbage collector;
# the culprit is listed where found). A module keeps fast tests (tests/test_markers.py checks that, and
# that every name listed exists). A test marked @pytest.mark.slow in its module (tests/test_newcomer.py)
# is slow too. A new test that takes a second or more, or half a second of CPU, belongs here.
SLOW_TESTS: dict[str, dict[str, float]] = {
    "test_accelerate.py": {
        # the fixture ``runs``: two spawns of two processes (gloo), 23 runs of the guide's recipe: 16.5 s at load 2-4 (37
        # at load 7), once per run (conftest.once_per_run)
        "test_resume_is_exact_in_a_fresh_process": 16.5,
        "test_each_sample_once_per_epoch_across_ranks": 16.5,
        "test_every_validation_covers_the_val_split_once": 16.5,
        "test_the_recipe_as_written_resumes_exactly": 16.5,
        "test_a_two_rank_state_loaded_on_one_rank_loses_and_repeats_nothing": 16.5,
    },
    "test_augment.py": {
        "test_crop_draws_like_torchvision": 0.74,  # s CPU in the fast run
        "test_per_sample_and_batch_paths_match_the_reference": 0.9,  # in the fast run
    },
    "test_bench_scripts.py": {
        # each runs a benchmark script end to end in its own process (imports, a template conversion, a loader
        # with 2 workers or three CLI processes): 5 s of wall each at load 3-4, 2-2.5 s of CPU in its children
        "test_bench_report_runs_and_prints_its_figures": 5.0,
        "test_bench_resume_runs_and_prints_its_figures": 5.0,
        "test_bench_resume_stream_runs_and_prints_its_figures": 5.0,
    },
    "test_buffers.py": {
        "test_a_failed_batch_gives_its_slot_back": 0.8,  # in the fast run
        "test_a_worker_waiting_for_a_slot_finds_its_main_process_under_every_start_method": 4.3,  # spawn's torch import
        "test_a_batch_handed_to_a_forked_child_changes_once_the_parent_moves_on_unless_cloned": 9.2,  # spawn, load ~9
    },
    "test_cli.py": {
        "test_python_dash_m_entry_point": 1.0,  # in the fast run
    },
    "test_cli_vocabulary.py": {
        "test_real_failures_return_the_documented_codes": 0.86,  # s CPU in the fast run
    },
    "test_convert.py": {
        "test_determinism_two_runs_byte_identical": 0.64,  # s CPU in the fast run
        "test_killed_cli_run_resumes_byte_identical": 2.2,
    },
    "test_decode.py": {
        "test_a_coarser_draft_is_not_a_reduced_finer_one": 5.6,  # in the fast run: the photos fixture, its only other user
        "test_decode_sizes_equals_decode_image_at_every_size": 7.9,
    },
    "test_dedup.py": {
        "test_every_cluster_and_group_lands_in_one_split": 1.2,  # in the fast run
    },
    "test_diff.py": {
        "test_diff_of_versions_in_s3": 1.9,
    },
    "test_docstrings.py": {
        "test_every_public_name_has_a_docstring": 0.56,  # s CPU in the fast run
    },
    "test_docs_examples.py": {
        # measured alone after the docs site's merge (load 3.2): README.md:45's case 15.4 s (9.4 of it setup)
        "test_block_runs": 15.4,
    },
    "test_device.py": {
        "test_a_lagging_side_stream_copies_no_batch_out_of_the_ring": 4.3,  # 30 ms per batch by design, load ~9
        "test_device_batches_equal_each_plain_batch_moved_by_hand": 1.7,
        "test_train_example_says_a_missing_device_in_one_line": 5.8,  # a subprocess imports torch, load ~9
    },
    "test_dups.py": {
        "test_a_stats_plot_that_cannot_be_written_is_one_line": 1.12,  # s CPU in the fast run
        "test_find_pairs_is_exact": 1.2,
        "test_low_detail_pictures_are_flagged_as_the_reference_computes": 3.7,  # 256 reference hashes
        "test_the_benchmark_duplicate_set_at_small_scale": 0.51,  # s CPU in the fast run
    },
    "test_eval_coverage.py": {
        "test_gloo_eval_on_two_ranks_covers_every_sample": 1.8,
    },
    "test_publish.py": {
        "test_a_run_killed_after_its_index_is_cleaned_by_the_next_run": 0.71,  # s CPU in the fast run
        "test_cli_exits_non_zero_until_the_limit_is_raised": 1.3,  # in the fast run
        "test_concurrent_saves_of_a_versions_hash_pairs_lose_none": 1.6,  # in the fast run
    },
    "test_offsetread.py": {
        "test_any_flipped_byte_is_caught_or_harmless": 0.8,  # in the fast run
        "test_object_storage_merges_neighbours_and_checks_as_locally": 1.6,  # in the fast run
    },
    "test_splitbase.py": {
        "test_inherited_splits_are_said_and_resplit_redraws_them": 2.0,
        "test_no_lesion_in_two_splits_and_each_keeps_its_split_in_the_next_version": 3.2,
        "test_resplit_through_the_cli": 1.4,
    },
    "test_imports.py": {
        "test_a_trainer_loads_no_converter_and_no_pillow": 2.3,
    },
    "test_learning.py": {
        "test_a_small_cnn_learns_digits_through_the_loader": 30.9,
    },
    "test_lightning.py": {
        # the fixture ``runs``: two spawns of two processes (gloo), 29 Lightning fits: 32 s at load 3-4 (58 at load 6),
        # once per run (conftest.once_per_run)
        "test_resume_is_exact_in_a_fresh_process": 31.9,
        "test_each_sample_once_per_epoch_across_ranks": 31.9,
        "test_validation_test_and_predict_cover_their_split_once": 31.9,
        "test_a_two_rank_checkpoint_resumed_on_one_rank_loses_and_repeats_nothing": 31.9,
        "test_a_one_rank_checkpoint_resumed_on_two_ranks_is_cut_at_lightnings_count": 31.9,
        "test_the_guide_recipe_resumes_exactly": 31.9,
        "test_no_lightning_warning_about_the_loaders": 31.9,
    },
    "test_loader.py": {
        "test_each_iterator_is_one_epoch_fixed_when_it_is_made": 6.5,  # 5 worker setups, 4 epochs each, load ~9
        "test_fuzzed_members_end_in_a_shard_error_or_their_own_samples": 1.8,
        "test_two_process_distributed": 16.7,
    },
    "test_loader_options.py": {
        "test_a_subset_function_reaches_spawned_workers": 6.8,
    },
    "test_loader_oracle.py": {
        "test_batches_kept_by_the_caller_never_change": 1.7,
        "test_config_train_loader_against_the_reference": 4.2,
        "test_drawn_configurations_against_the_reference": 16.6,
        "test_explicit_epochs_and_advance_without_set_epoch": 3.7,
        # 2.9 s CPU in the fast run, all of it the module's fixtures, which no other fast test uses
        "test_index_reader_refuses_a_shard_that_does_not_match_its_index": 2.9,
        "test_index_reader_skips_damaged_samples_one_rank": 1.1,
        "test_matrix_against_the_reference": 16.1,
        "test_on_error_skip_in_an_eval_pass": 4.8,  # s CPU in the fast run (31 s of wall at load 8-10)
        "test_on_error_skip_with_a_damaged_shard": 1.7,
        "test_oracle_sees_a_swapped_image": 3.0,
        "test_oracle_sees_its_own_pixels_with_another_epochs_transform": 9.5,
        "test_pixels_do_not_depend_on_workers_buffer_or_batch_size": 1.1,
        "test_ranks_against_the_reference": 63.7,
        "test_ranks_skip_damaged_samples_without_repeats": 20.1,
        "test_ranks_top_up_skipped_damage_without_repeats": 24.4,
        "test_resampled_with_epoch_batches": 2.4,
        "test_top_up_reads_spare_shards_only_after_damage": 4.2,
    },
    "test_lock.py": {
        "test_a_killed_holder_leaves_a_lock_the_next_run_takes_over": 2.0,
        "test_a_second_conversion_is_refused_at_once_naming_the_holder": 1.3,
        "test_multi_size_run_locks_every_size_and_a_refusal_takes_nothing": 1.6,
        "test_object_storage_uses_a_conditional_create_marker": 1.5,
        "test_of_many_simultaneous_takers_exactly_one_wins": 17.8,
        "test_without_posix_locks_a_marker_is_used": 0.8,  # in the fast run
    },
    "test_manifest.py": {
        "test_floats_round_trip": 0.53,  # s CPU in the fast run
        "test_integers_round_trip": 0.58,  # s CPU in the fast run
        "test_strings_keep_their_text_stripped": 3.3,
    },
    "test_meta.py": {
        "test_mask_factorize_and_array_match_plain_python": 2.3,
        "test_values_round_trip_through_samples_npz": 1.4,
    },
    "test_identity.py": {
        # 0.8 s in the full run, 10.5 s in two fast runs: its 2 workers' shutdown after the error it expects
        "test_streaming_bare_tars_refuses_samples_of_another_dataset_naming_both_shards": 10.5,
    },
    "test_npy.py": {
        "test_image_side_equals_numpys_parse_on_any_damage": 1.2,
    },
    "test_plan.py": {
        "test_fixed_units_keep_their_split_and_the_others_follow_the_rule": 2.0,
        "test_split_groups_is_a_pure_function_of_groups_labels_and_seed": 3.5,
        "test_stratified_val_is_within_half_the_largest_group_of_its_share": 7.6,
        "test_without_stratify_a_unit_goes_by_its_own_hash": 1.3,
    },
    "test_readers.py": {
        "test_hugging_face_datasets": 2.2,
        "test_hugging_face_datasets_reads_a_sparse_metadata_column": 1.6,
        "test_ray_data": 17.0,
        # 2.4 s, and its DataLoader iterator (2 workers, left to the garbage collector after the ValueError the
        # test expects) stalls whichever test follows for 5-10 s (test_wids_reads_in_place in the full run)
        "test_webdataset_one_shard_split_with_two_workers": 2.4,
    },
    "test_readonly.py": {
        "test_a_complete_folder_on_a_read_only_mount_is_nothing_to_do": 1.6,
        "test_index_on_a_read_only_folder_missing_a_sidecar_is_one_line": 1.4,  # in the fast run
    },
    "test_report.py": {  # each writes one or more pages (matplotlib, thumbnails), 2026-11-28 at load 7.5
        "test_caps_hold_on_a_set_of_many_classes_and_columns_of_free_text": 7.5,  # converts 1,200 images
        "test_cli_writes_the_default_name_and_says_so": 2.6,
        "test_the_page_opens_from_disk_in_chromium_without_a_console_error": 2.4,  # starts Chromium
        "test_errors_name_the_path": 2.2,
        "test_progress_shows_once_the_report_has_run_two_seconds": 1.9,
        "test_thumbnails_past_the_byte_budget_are_named_not_shown": 1.3,
        "test_the_page_needs_no_network_and_is_the_same_bytes_every_run": 1.3,
        "test_the_golden_folders_of_every_format_version": 3.5,  # versions 1 and 2: the search hashes the pixels
    },
    "test_reproducible.py": {
        "test_a_copied_corpus_converts_to_the_same_bytes": 0.8,  # in the fast run
    },
    "test_resolve.py": {
        "test_s3_folder_index_and_pattern": 1.2,  # in the fast run
    },
    "test_resume.py": {
        "test_a_replay_rotates_the_workers_into_the_dataloaders_order": 7.9,  # a DataLoader per stop, load ~9
        "test_a_resumed_streamed_epoch_is_the_uninterrupted_one": 18.0,  # 6 configurations x 4 stops, load ~9
        "test_a_resumed_streamed_evaluation_is_exact_or_refused": 5.5,  # load ~9
        "test_elastic_resume_covers_the_split_once": 1.0,
        "test_planner_resume": 1.7,
        "test_planner_resume_in_evaluation": 1.0,  # measured alone, load ~7
        "test_resume_in_the_other_worker_paths": 1.4,
        "test_resume_is_exact_in_a_fresh_process": 67.0,
        "test_stream_rest_never_reopens_a_shard": 1.8,
        "test_streaming_resumes_on_other_ranks_only_where_nothing_is_lost": 1.5,  # load ~9
        "test_the_issues_streamed_resume_yields_the_rest_of_the_epoch": 1.8,  # load ~9
        "test_train_example_resumes_with_its_checkpoint": 63.4,
    },
    "test_reuse.py": {
        "test_an_edit_that_keeps_size_and_mtime_is_missed_by_default_and_caught_by_checksum": 1.2,  # in the fast run
        "test_base_selection": 1.1,  # in the fast run
        "test_counts_agree_with_diff_over_random_manifests": 1.7,
        "test_mixed_changes_decode_only_what_changed": 0.8,  # in the fast run
        "test_quick_check_reads_only_what_changed": 1.1,  # in the fast run
    },
    "test_runner.py": {
        "test_kill_9_of_the_cli_leaves_no_worker_and_closes_its_pipes": 3.1,
        "test_local_runner_in_process_and_pool_agree": 1.8,  # in the fast run
        "test_ordered_yields_in_order_and_bounds_what_is_started": 1.3,
        "test_ray_executor_is_byte_identical_to_local": 15.3,
        "test_ray_executor_multi_size_is_byte_identical_to_local": 11.1,
        "test_signal_to_the_main_pid_alone_ends_convert_with_the_resume_line": 1.8,
        "test_a_signal_during_the_pools_forks_waits_for_them_and_workers_take_theirs": 1.4,  # load 5-7
    },
    "test_schedule.py": {
        "test_fewer_shards_than_workers_gives_the_bytes_of_one_worker": 1.5,  # in the fast run
        # three conversions in a fresh process per case: 3.3 s CPU (spawned pool), 0.9-1.4 s the others; load 5-7
        "test_every_worker_count_and_byte_path_writes_one_process_bytes": 7.2,
    },
    "test_space.py": {
        "test_disk_full_in_the_pool_leaves_no_partial_file_and_resumes": 4.1,  # 0.8-1.2 s CPU; load 5-7
    },
    "test_spill.py": {
        "test_a_size_already_converted_is_kept_and_the_other_made": 0.63,  # s CPU in the fast run
        "test_killed_multi_size_run_resumes_byte_identical": 3.2,
        "test_multi_size_incremental_equals_separate_incremental_runs": 1.3,
        "test_multi_size_run_equals_separate_runs": 2.5,
    },
    "test_statedict.py": {
        "test_fuzzed_states_are_refused_by_name_or_continue_exactly": 2.2,  # measured with test_resume.py, load ~7
    },
    "test_stats.py": {
        "test_plot_draws_each_split": 0.94,  # s CPU in the fast run (matplotlib's import, no other fast test's)
        "test_remote_damage_is_named_as_locally": 0.8,  # in the fast run
        "test_s3_and_http_give_the_local_report": 1.1,
    },
    "test_objects.py": {
        "test_conversion_into_s3_equals_local": 1.1,
        "test_failed_upload_leaves_no_index_entry": 0.9,  # in the fast run
        "test_interrupted_conversion_resumes_in_s3": 1.0,
        "test_loader_reads_s3_shards_by_offset_and_streaming": 1.7,  # in the fast run
        "test_multi_size_conversion_into_s3_equals_local": 2.8,
        "test_sources_in_s3_are_compared_by_manifest_hash_not_by_mtime": 1.1,
    },
    "test_tar.py": {
        "test_fuzzed_tars_end_in_a_shard_error_or_a_recorded_error": 1.8,
    },
    "test_transform.py": {
        "test_readme_recipe_albumentations": 0.73,  # s CPU in the fast run
    },
    "test_transport.py": {
        "test_every_store_gives_the_same_bytes": 1.1,
        "test_missing_files_and_listing": 1.2,
    },
    "test_unfinished.py": {
        "test_a_complete_folder_is_read_without_writing": 3.7,
    },
    "test_verify.py": {
        "test_any_damage_to_index_json_is_a_report_never_a_traceback": 1.4,  # in the fast run
        "test_any_damage_to_metadata_columns_is_a_report_never_a_traceback": 1.1,  # in the fast run
        "test_any_damage_to_samples_npz_columns_is_a_report_never_a_traceback": 1.6,  # in the fast run
        "test_cli_reads_urls": 1.1,  # in the fast run
        "test_columns_read_by_row_ranges_match_numpy_load": 1.5,
        "test_s3_and_http_are_verified_as_locally": 3.3,
        "test_s3_and_http_report_damage_as_locally": 5.3,
        "test_s3_and_http_scan_as_locally": 0.8,  # in the fast run
    },
}


# The longest tests of the full suite (seconds of wall in one run of ``make test`` on the 2-core VM at load 8-10,
# pytest --durations), run first: pytest-xdist hands tests out in collection order, and one of these started
# last would hold the whole suite's end behind it while the other workers sit idle.
LONG_FIRST: dict[tuple[str, str], float] = {
    ("test_newcomer.py", "test_fresh_venv_install_and_quick_start"): 317,
    ("test_loader_oracle.py", "test_ranks_against_the_reference"): 203,
    ("test_packaging.py", "test_the_wheel_installs_into_a_fresh_venv_and_runs_the_quick_start"): 85,
    ("test_resume.py", "test_resume_is_exact_in_a_fresh_process"): 84,
    ("test_loader_oracle.py", "test_ranks_top_up_skipped_damage_without_repeats"): 83,
    ("test_resume.py", "test_train_example_resumes_with_its_checkpoint"): 78,
    # the spawned runs of these modules (33 and 16.5 s at load 2-4): one test each, not a parametrized one, whose cases
    # would start on both workers and leave one waiting for the other's runs
    ("test_lightning.py", "test_each_sample_once_per_epoch_across_ranks"): 33,
    ("test_accelerate.py", "test_each_sample_once_per_epoch_across_ranks"): 16.5,
    ("test_learning.py", "test_a_small_cnn_learns_digits_through_the_loader"): 62,
    ("test_loader_oracle.py", "test_ranks_skip_damaged_samples_without_repeats"): 48,
}


def pytest_collection_modifyitems(config, items):
    """Mark the tests SLOW_TESTS lists as ``slow``; put the LONG_FIRST ones first, longest first (a stable
    sort: every other test keeps its place)."""
    for item in items:
        name = getattr(item, "originalname", None) or item.name.split("[")[0]
        if name in SLOW_TESTS.get(item.path.name, {}):
            item.add_marker(pytest.mark.slow)

    def first(item) -> float:
        name = getattr(item, "originalname", None) or item.name.split("[")[0]
        return -LONG_FIRST.get((item.path.name, name), 0.0)

    items.sort(key=first)
