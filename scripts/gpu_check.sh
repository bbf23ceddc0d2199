#!/bin/sh
# What only a GPU machine can check (docs/guide/figures.md, GPU), in stages, each under `timeout`, each stage's
# output written to OUT/<stage>.log as it comes and its exit status to OUT/summary.txt:
#
#   preflight  python, torch and CUDA versions, the GPUs, the cores, `df -h /dev/shm`, nvidia-smi
#   tests      tests/test_device.py (its CUDA tests), tests/test_buffers.py, tests/test_augment.py
#   corpus     scripts/bench_gpu.py --make-corpus 8000: ImageNet-sized JPEGs and their 224 px shards in WORK
#   figures    scripts/bench_gpu.py --seconds SECONDS_PER_FEED, each figure appended to OUT/results.md and
#              results.jsonl as it is measured (the corpus made first where this machine lacks it)
#
# Run from the checkout's root:
#
#     sh scripts/gpu_check.sh WHEELS [OUT] [STAGES]
#
# WHEELS: a folder of the pure-Python wheels the GPU machine lacks (it has python3, torch, torchvision, numpy,
# Pillow, OpenCV, PyYAML, xxhash, click, tqdm), made on a machine with the registry by
#     .venv/bin/pip download --no-deps -d wheels webdataset==1.0.2 braceexpand==0.1.7 pytest==9.2.0 \
#         pluggy==1.7.0 iniconfig==2.3.1 packaging==26.4 Pygments==2.21.0
# `wheels/` at the checkout's root is git-ignored (.gitignore): a device tool that copies the working tree
# copies ignored paths only where told to (carry it: `carry: ["wheels"]`).
# OUT: where the logs and figures go ($OUT, else ./gpu-out, also git-ignored). STAGES: comma-separated, default
# all four. Device time is short (15 min in all, start-up included, 10 min at most per call), so run it as two
# calls, each within 10 min by its stages' limits:
#
#     sh scripts/gpu_check.sh wheels "$OUT" preflight,tests,corpus     # limits 60 + 240 + 240 s
#     SECONDS_PER_FEED=5 sh scripts/gpu_check.sh wheels "$OUT" figures  # limit 540 s (the corpus first if missing)
#
# Settable: SECONDS_PER_FEED (default 6), WORK (the corpus, default /tmp/gpu-bench), and each stage's limit in
# seconds: PREFLIGHT_TIMEOUT (60), TESTS_TIMEOUT (240), CORPUS_TIMEOUT (240), FIGURES_TIMEOUT (540).
set -u

preflight() {
    python3 -c "import sys, torch; print('python', sys.version.split()[0]); print('torch', torch.__version__, \
'CUDA', torch.version.cuda, 'HIP', torch.version.hip); print('GPUs', [torch.cuda.get_device_name(i) \
for i in range(torch.cuda.device_count())])"
    echo "cores: $(nproc)"
    df -h /dev/shm
    nvidia-smi
}

tests() {
    python3 -m pytest -q -p no:cacheprovider -rs --durations=15 tests/test_device.py tests/test_buffers.py \
        tests/test_augment.py
}

corpus() {
    python3 scripts/bench_gpu.py --make-corpus 8000 --work "$WORK"
}

figures() {
    [ -f "$WORK/shards/v1/224/index.json" ] || corpus || return
    python3 scripts/bench_gpu.py --work "$WORK" --results "$OUT_DIR" --seconds "$SECONDS_PER_FEED"
}

if [ "${1:-}" = --run ]; then  # one stage's body, run by `stage` below under timeout
    "$2"
    exit
fi

WHEELS=${1:?usage: sh scripts/gpu_check.sh WHEELS [OUT] [STAGES]}
OUT_DIR=${2:-${OUT:-gpu-out}}
STAGES=${3:-preflight,tests,corpus,figures}
SECONDS_PER_FEED=${SECONDS_PER_FEED:-6}
WORK=${WORK:-/tmp/gpu-bench}
mkdir -p "$OUT_DIR"
DEPS=$(mktemp -d)
[ -d "$WHEELS" ] || { echo "no wheels folder $WHEELS (see the head of $0)" >&2 && exit 2; }
for w in "$WHEELS"/*.whl; do  # pure-Python wheels: unzipped
    [ -e "$w" ] || continue
    python3 -m zipfile -e "$w" "$DEPS" || exit 1
done
export PYTHONPATH="$PWD:$DEPS" PYTHONFAULTHANDLER=1 PYTHONUNBUFFERED=1 OUT_DIR SECONDS_PER_FEED WORK

stage() {  # stage NAME LIMIT: the stage under timeout, its output to the terminal and to OUT/NAME.log as it comes
    printf '\n== %s (at most %s s)\n' "$1" "$2"
    t0=$(date +%s)
    { timeout -k 15 "$2" sh "$0" --run "$1"; echo $? > "$OUT_DIR/$1.rc"; } 2>&1 | tee "$OUT_DIR/$1.log"
    rc=$(cat "$OUT_DIR/$1.rc")
    why=""
    [ "$rc" = 124 ] && why=" (timed out)"
    printf '== %s: exit %s after %s s%s\n' "$1" "$rc" "$(($(date +%s) - t0))" "$why" | tee -a "$OUT_DIR/summary.txt"
}

for s in $(echo "$STAGES" | tr ',' ' '); do
    case $s in
    preflight) stage preflight "${PREFLIGHT_TIMEOUT:-60}" ;;
    tests) stage tests "${TESTS_TIMEOUT:-240}" ;;
    corpus) stage corpus "${CORPUS_TIMEOUT:-240}" ;;
    figures) stage figures "${FIGURES_TIMEOUT:-540}" ;;
    *) echo "unknown stage '$s': expected preflight, tests, corpus or figures" >&2 && exit 2 ;;
    esac
done
