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
# Extra pytest arguments, e.g. `make test PYTEST_ARGS="-k console"`.
PYTEST_ARGS ?=
# pytest-xdist workers: the suite mostly waits on real processes, so more workers than cores pay.
# `--dist loadscope` runs each module's tests in one worker, so a module's stack (broker, Redis,
# simulator, workers) starts once per broker, not once per worker that got one of its tests.
# (Not `loadgroup`: with pytest 9.2 its grouping silently does nothing, pytest-xdist#1386.)
TEST_WORKERS ?= 4
# The slowest tests, printed after each run (the time goes there first).
DURATIONS ?= 15

.DEFAULT_GOAL := help
.PHONY: help run test test-all lint typecheck check bench clean system-deps

help: ## this list
	@echo "Switchboard: make <target>"
	@grep -hE '^[a-z][a-z-]*:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-z-]+):.*## (.*)$$/  \1\t\2/' | expand -t 14

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

run: $(RUN_STAMP) ## start Switchboard on its embedded defaults (console at http://127.0.0.1:8080/console/)
	@echo "==> $(BIN)/switchboard up $(RUN_ARGS)"
	@$(BIN)/switchboard up $(RUN_ARGS)

$(SYSTEM_STAMP): $(STAMP)
	-@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  missing=""; \
	  command -v promtool >/dev/null || missing="$$missing prometheus"; \
	  command -v chromium >/dev/null || missing="$$missing chromium fonts-noto-color-emoji"; \
	  command -v haproxy >/dev/null || missing="$$missing haproxy"; \
	  if [ -n "$$missing" ]; then \
	    echo "==> installing test tools with apt-get:$$missing"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing) >/dev/null 2>&1 \
	      || echo "note: could not install$$missing; the tests that need them will skip"; \
	  fi; \
	fi
	@touch $(SYSTEM_STAMP)

system-deps: $(SYSTEM_STAMP) ## the Debian test tools (chromium, prometheus, haproxy) when run as root

test: $(STAMP) $(SYSTEM_STAMP) check ## the fast tier: lint, types, unit tests, integration on Tansu and Redis
	$(BIN)/pytest -q -p no:cacheprovider -m "not full" -n $(TEST_WORKERS) --dist loadscope --durations=$(DURATIONS) $(PYTEST_ARGS)

# The full tier needs Apache Kafka (Java 17 and Maven fetch its jars): without them it stops
# rather than pass with a broker's worth of tests left out.
test-all: $(STAMP) $(SYSTEM_STAMP) check ## the full tier (CI): everything on Tansu and Apache Kafka, faults, chaos, clusters
	@command -v java >/dev/null && command -v mvn >/dev/null || { \
	  echo "make test-all: Apache Kafka needs java (17+) and mvn on PATH; install them (apt-get install openjdk-17-jre-headless maven)"; exit 2; }
	@# Both parts run whatever the first one says; the target fails if either did.
	@export SWITCHBOARD_TEST_BROKERS=tansu,kafka SWITCHBOARD_TEST_TIER=all; status=0; \
	echo "==> everything but the fault suites, $(TEST_WORKERS) test processes"; \
	$(BIN)/pytest -q -p no:cacheprovider -m "not alone" -n $(TEST_WORKERS) --dist loadscope --durations=$(DURATIONS) $(PYTEST_ARGS) || status=$$?; \
	echo "==> the fault suites, one test at a time on an otherwise idle machine"; \
	$(BIN)/pytest -q -p no:cacheprovider -m alone --durations=$(DURATIONS) $(PYTEST_ARGS) || status=$$?; \
	exit $$status

check: lint typecheck ## lint, format check and type check

lint: $(STAMP) ## ruff and the format check
	$(BIN)/ruff check pipeline tests bench
	$(BIN)/ruff format --check pipeline tests bench

typecheck: $(STAMP) ## mypy over pipeline, tests and bench
	$(BIN)/mypy pipeline tests bench

bench: $(STAMP) ## switchboard bench: the worker against the bare turn (see bench/README.md)
	$(BIN)/switchboard bench

clean: ## remove the virtualenv and the tools' caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
