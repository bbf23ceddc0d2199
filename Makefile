# The two commands a new user needs:  make demo  and  make test
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/pip install --quiet --disable-pip-version-check -c constraints.txt
# One stamp per set of extras: the demo needs `train` (torch, OpenCV, PyYAML) and `report` (Jinja2, matplotlib: its
# last step writes the demo set's page); the tests,
# benchmarks and linters need the full set (Ray, pyarrow, moto, scikit-learn, h5py besides: about twice the size);
# the docs, the docs extra alone.
DEMO_STAMP := $(VENV)/.installed-train
FULL_STAMP := $(VENV)/.installed-full
DOCS_STAMP := $(VENV)/.docs-installed

.PHONY: demo test test-fast lint docs cli-reference setup clean bench

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(DEMO_STAMP): pyproject.toml constraints.txt | $(BIN)/python
	$(PIP) -e '.[train,report]'
	touch $@

$(FULL_STAMP): pyproject.toml constraints.txt | $(BIN)/python
	$(PIP) -e '.[train,test,bench,lint,augment,plot,report]'
	touch $@ $(DEMO_STAMP)

setup: $(FULL_STAMP)

## make demo: set up (the train and report extras), generate a small synthetic corpus (with a few bad files), convert it, show, check and verify the result, train a small CNN on it, print the next steps; in corpus/ and shards/v1/224, where the README's Quick start has them (both git-ignored), then write the demo set's report page (report-v1-224.html) and print its path
demo: $(DEMO_STAMP)
	$(BIN)/python scripts/make_demo_corpus.py --out corpus --count 300
	$(BIN)/wds-tools convert --source corpus/manifest.csv --version v1 --size 224 --out shards --workers 2 --shard-size 64 --max-errors 5%
	$(BIN)/python scripts/show_shards.py shards/v1/224
	$(BIN)/wds-tools stats shards/v1/224 --loader-workers 2
	$(BIN)/wds-tools verify shards/v1/224
	$(BIN)/python scripts/train_example.py --shards shards/v1/224 --epochs 6
	$(BIN)/wds-tools report shards/v1/224 -o report-v1-224.html -q
	@$(BIN)/python scripts/demo_next_steps.py shards/v1/224 report-v1-224.html

# pytest-xdist processes for make test and test-fast: one per core, at most 4 (TEST_WORKERS=0: in this process)
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -gt 4 ] && n=4; echo $$n)
# bytecode written even where the environment says not to (PYTHONDONTWRITEBYTECODE, as many containers set it):
# otherwise every run rewrites the asserts of every test module again in every process, 4-5 s of CPU each
PYTEST := PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest

## make test: set up and run the whole test suite (on TEST_WORKERS processes)
test: $(FULL_STAMP)
	$(PYTEST) -q -n $(TEST_WORKERS)

## make test-fast: the tests not marked slow (tests/conftest.py says which are, and why): 55 s of CPU over the cores (docs/guide/figures.md, The test suite)
test-fast: $(FULL_STAMP)
	$(PYTEST) -q -n $(TEST_WORKERS) -m "not slow"

## make lint: ruff (rules in pyproject.toml), ruff's format check, mypy over every module of wds_tools and training_adapter
lint: $(FULL_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# the docs extra alone (MkDocs, Material, mkdocstrings) and the package; no test or bench extras needed
$(DOCS_STAMP): pyproject.toml constraints.txt | $(BIN)/python
	$(PIP) -e '.[docs]'
	touch $@

## make docs: the documentation site (mkdocs.yml, docs/) built into site/; --strict: a broken link or API name fails; then every internal link of the built pages must lead to a file (so site/index.html works opened from disk)
docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict
	$(BIN)/python scripts/check_site_links.py site

## make cli-reference: regenerate docs/reference/cli.md from every command's --help (after changing an option)
cli-reference: $(DOCS_STAMP)
	$(BIN)/python scripts/gen_cli_reference.py

bench: $(FULL_STAMP)
	$(BIN)/python scripts/bench_convert.py

# shards/ may hold your own conversions and corpus/ your own images: make clean leaves both (demo/: what make demo wrote before)
clean:
	rm -rf $(VENV) demo bench-data site report-v1-224.html
