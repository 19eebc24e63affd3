# Each target sets up its own virtualenv on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint typecheck bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/switchboard up

test: $(STAMP)
	$(BIN)/ruff check pipeline tests bench
	$(BIN)/pytest -q -p no:cacheprovider $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check pipeline tests bench
	$(BIN)/mypy pipeline

bench: $(STAMP)
	$(BIN)/switchboard bench

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
