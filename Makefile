# Each target sets up its own virtualenv on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint typecheck bench clean system-deps

# Test-only system tools from Debian (promtool/prometheus for the alert tests, chromium for the
# console page test). Best effort: without root or apt those tests skip and say why.
SYSTEM_STAMP := $(VENV)/.system-deps

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/switchboard up

$(SYSTEM_STAMP): $(STAMP)
	-@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  missing=""; \
	  command -v promtool >/dev/null || missing="$$missing prometheus"; \
	  command -v chromium >/dev/null || missing="$$missing chromium fonts-noto-color-emoji"; \
	  if [ -n "$$missing" ]; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing) >/dev/null 2>&1 \
	      || echo "note: could not install$$missing; the tests that need them will skip"; \
	  fi; \
	fi
	touch $(SYSTEM_STAMP)

system-deps: $(SYSTEM_STAMP)

test: $(STAMP) $(SYSTEM_STAMP) lint
	$(BIN)/pytest -q -p no:cacheprovider $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check pipeline tests bench
	$(BIN)/ruff format --check pipeline tests bench
	$(BIN)/mypy pipeline

bench: $(STAMP)
	$(BIN)/switchboard bench

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
