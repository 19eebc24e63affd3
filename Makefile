# Each target sets up its own virtualenv on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Two stamps: `make run` needs the package and its runtime dependencies only (what `pip install .`
# and the Docker image get); `make test` needs `.[dev]` (test tools, linters, platform SDKs).
RUN_STAMP := $(VENV)/.installed-run
STAMP := $(VENV)/.installed
# Extra arguments for `switchboard up`, e.g. `make run RUN_ARGS="--web-port 8081"`.
RUN_ARGS ?=

.PHONY: run test lint typecheck bench clean system-deps

# Test-only system tools from Debian (promtool/prometheus for the alert tests, chromium for the
# console page test). Best effort: without root or apt those tests skip and say why.
SYSTEM_STAMP := $(VENV)/.system-deps

define make_venv
	@test -x $(BIN)/python || { echo "==> creating the virtualenv $(VENV) ($$($(PYTHON) --version))"; $(PYTHON) -m venv $(VENV); }
	@echo "==> updating pip in $(VENV)"
	@$(BIN)/pip install -q --upgrade pip
endef

$(RUN_STAMP): pyproject.toml constraints.txt
	$(make_venv)
	@echo "==> installing Switchboard and its runtime dependencies (pip install -e ., pinned by constraints.txt); about a minute the first time"
	@PYTHONWARNINGS=ignore $(BIN)/pip install -q -c constraints.txt -e .
	@touch $@

$(STAMP): pyproject.toml constraints.txt
	$(make_venv)
	@echo "==> installing Switchboard with the test and development tools (pip install -e '.[dev]', pinned by constraints.txt); a few minutes the first time"
	@PYTHONWARNINGS=ignore $(BIN)/pip install -q -c constraints.txt -e '.[dev]'
	@touch $@ $(RUN_STAMP)

run: $(RUN_STAMP)
	@echo "==> $(BIN)/switchboard up $(RUN_ARGS)"
	@$(BIN)/switchboard up $(RUN_ARGS)

$(SYSTEM_STAMP): $(STAMP)
	-@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  missing=""; \
	  command -v promtool >/dev/null || missing="$$missing prometheus"; \
	  command -v chromium >/dev/null || missing="$$missing chromium fonts-noto-color-emoji"; \
	  if [ -n "$$missing" ]; then \
	    echo "==> installing test tools with apt-get:$$missing"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing) >/dev/null 2>&1 \
	      || echo "note: could not install$$missing; the tests that need them will skip"; \
	  fi; \
	fi
	@touch $(SYSTEM_STAMP)

system-deps: $(SYSTEM_STAMP)

test: $(STAMP) $(SYSTEM_STAMP) lint
	$(BIN)/pytest -q -p no:cacheprovider $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check pipeline tests bench
	$(BIN)/ruff format --check pipeline tests bench
	$(BIN)/mypy pipeline tests bench

bench: $(STAMP)
	$(BIN)/switchboard bench

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
