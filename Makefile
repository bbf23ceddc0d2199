# The two commands a new user needs:  make demo  and  make test
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DOCS_STAMP := $(VENV)/.docs-installed

.PHONY: demo test lint docs cli-reference setup clean bench

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[test,bench,lint,augment]'
	touch $(STAMP)

setup: $(STAMP)

## make demo: set up, generate a small synthetic corpus (with a few bad files), convert it, show, check and verify the result, train a small CNN on it
demo: $(STAMP)
	$(BIN)/python scripts/make_demo_corpus.py --out demo/corpus --count 300
	cd demo && ../$(BIN)/wds-tools convert --source corpus/manifest.csv --version v1 --size 224 --out shards --workers 2 --shard-size 64 --max-errors 5%
	$(BIN)/python scripts/show_shards.py demo/shards/v1/224
	cd demo && ../$(BIN)/wds-tools stats shards/v1/224 --loader-workers 2
	cd demo && ../$(BIN)/wds-tools verify shards/v1/224
	$(BIN)/python scripts/train_example.py --shards demo/shards/v1/224 --epochs 6

## make test: set up and run the test suite
test: $(STAMP)
	$(BIN)/python -m pytest -q

## make lint: ruff (rules in pyproject.toml), ruff's format check, mypy on wds_tools.format and training_adapter
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# the docs extra alone (MkDocs, Material, mkdocstrings) and the package; no test or bench extras needed
$(DOCS_STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[docs]'
	touch $(DOCS_STAMP)

## make docs: the documentation site (mkdocs.yml, docs/) built into site/; --strict: a broken link or API name fails
docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

## make cli-reference: regenerate docs/reference/cli.md from every command's --help (after changing an option)
cli-reference: $(DOCS_STAMP)
	$(BIN)/python scripts/gen_cli_reference.py

bench: $(STAMP)
	$(BIN)/python scripts/bench_convert.py

clean:
	rm -rf $(VENV) demo bench-data site
