# The two commands a new user needs:  make demo  and  make test
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/pip install --quiet --disable-pip-version-check -c constraints.txt
# One stamp per set of extras: the demo needs only `train` (torch, OpenCV, PyYAML); the tests,
# benchmarks and linters need the full set (Ray, pyarrow, moto, scikit-learn, h5py besides: about twice the size).
DEMO_STAMP := $(VENV)/.installed-train
FULL_STAMP := $(VENV)/.installed-full

.PHONY: demo test test-fast lint setup clean bench

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(DEMO_STAMP): pyproject.toml constraints.txt | $(BIN)/python
	$(PIP) -e '.[train]'
	touch $@

$(FULL_STAMP): pyproject.toml constraints.txt | $(BIN)/python
	$(PIP) -e '.[train,test,bench,lint,augment]'
	touch $@ $(DEMO_STAMP)

setup: $(FULL_STAMP)

## make demo: set up (the train extra only), generate a small synthetic corpus (with a few bad files), convert it, show, check and verify the result, train a small CNN on it, print the next steps
demo: $(DEMO_STAMP)
	$(BIN)/python scripts/make_demo_corpus.py --out demo/corpus --count 300
	cd demo && ../$(BIN)/wds-tools convert --source corpus/manifest.csv --version v1 --size 224 --out shards --workers 2 --shard-size 64 --max-errors 5%
	$(BIN)/python scripts/show_shards.py demo/shards/v1/224
	cd demo && ../$(BIN)/wds-tools stats shards/v1/224 --workers 2
	cd demo && ../$(BIN)/wds-tools verify shards/v1/224
	$(BIN)/python scripts/train_example.py --shards demo/shards/v1/224 --epochs 6
	@$(BIN)/python scripts/demo_next_steps.py demo/shards/v1/224

## make test: set up and run the whole test suite
test: $(FULL_STAMP)
	$(BIN)/python -m pytest -q

## make test-fast: the tests not marked slow (tests/conftest.py says which are, and why), under a minute
test-fast: $(FULL_STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

## make lint: ruff (rules in pyproject.toml), ruff's format check, mypy on wds_tools.format and training_adapter
lint: $(FULL_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: $(FULL_STAMP)
	$(BIN)/python scripts/bench_convert.py

clean:
	rm -rf $(VENV) demo bench-data
