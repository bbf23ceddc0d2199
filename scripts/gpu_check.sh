#!/bin/sh
# What only a GPU machine can check (docs/guide/figures.md, GPU): the CUDA tests of tests/test_device.py, then
# scripts/bench_gpu.py on 8,000 ImageNet-sized JPEGs converted at 224 px. Run from the checkout's root:
#
#     sh scripts/gpu_check.sh WHEELS [OUT]
#
# WHEELS: a folder of the wheels the GPU machine lacks (it has python3, torch, torchvision, numpy, Pillow,
# OpenCV, PyYAML, xxhash, click, tqdm), made on a machine with the registry by
#     .venv/bin/pip download --no-deps -d wheels webdataset==1.0.2 braceexpand==0.1.7 pytest==9.2.0 \
#         pluggy==1.7.0 iniconfig==2.3.1 packaging==26.4 Pygments==2.21.0
# OUT: where the logs and figures go, written as they come ($OUT, else ./gpu-out). The corpus goes to /tmp.
# Device time: about 1 min for the CUDA tests, 1 min for the corpus, 6 min for the figures (--seconds 10).
set -u
WHEELS=${1:?usage: sh scripts/gpu_check.sh WHEELS [OUT]}
OUT_DIR=${2:-${OUT:-gpu-out}}
SECONDS_PER_FEED=${SECONDS_PER_FEED:-10}
mkdir -p "$OUT_DIR"
DEPS=$(mktemp -d)
for w in "$WHEELS"/*.whl; do python3 -m zipfile -e "$w" "$DEPS" || exit 1; done  # pure-Python wheels: unzipped
export PYTHONPATH="$PWD:$DEPS"
nvidia-smi > "$OUT_DIR/nvidia-smi.txt" 2>&1
python3 -m pytest -q -p no:cacheprovider tests/test_device.py tests/test_buffers.py 2>&1 | tee "$OUT_DIR/tests.log"
python3 scripts/bench_gpu.py --make-corpus 8000 --work /tmp/gpu-bench 2>&1 | tee "$OUT_DIR/corpus.log"
python3 scripts/bench_gpu.py --work /tmp/gpu-bench --results "$OUT_DIR" --seconds "$SECONDS_PER_FEED" 2>&1 | tee "$OUT_DIR/bench_gpu.log"
