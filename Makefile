# Everything a fresh clone needs is installed from here: `make demo`, `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev

.PHONY: demo test lint typecheck unit bench browser alerting-stack system-deps clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	touch $@

$(DEV_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $@ $(STAMP)

## demo: run the whole pipeline on the embedded store (spans in, analysis, alerts, dashboards)
demo: $(STAMP)
	$(BIN)/tailwatch demo

# The system packages the tests need, each as "command:package"; `make test` says up front which
# ones it is about to install, and where it cannot (not root, no apt-get) what to run instead.
SYSTEM_DEPS := chromium:chromium prometheus-alertmanager:prometheus-alertmanager prometheus:prometheus
# Shell: sets $missing to the packages of the pairs in $(1) whose command is not on PATH.
define find_missing
missing=""; for dep in $(1); do command -v "$${dep%%:*}" >/dev/null 2>&1 || missing="$$missing $${dep#*:}"; done
endef
define apt_install
	@$(call find_missing,$(1)); \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian's$$missing with apt-get ($(2))"; \
	  if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then \
	    echo "make: cannot install$$missing here (needs root and apt-get): run 'sudo apt-get install --no-install-recommends$$missing' (or your system's packages providing them), then 'make test' again" >&2; \
	    exit 1; fi; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; } || { \
	    echo "make: apt-get could not install$$missing: run 'apt-get install --no-install-recommends$$missing' to see why, then 'make test' again" >&2; exit 1; }; \
	fi
endef

## system-deps: say which system packages `make test` will install (before anything runs)
system-deps:
	@$(call find_missing,$(SYSTEM_DEPS)); \
	if [ -n "$$missing" ]; then echo "make test will install Debian's$$missing with apt-get (needs root) before running the tests"; fi

## browser: Debian's Chromium for the dashboard tests and PNG export, when missing
browser:
	$(call apt_install,chromium:chromium,needed by the dashboard tests and PNG export)

## alerting-stack: Debian's Alertmanager and Prometheus for the alerting tests, when missing
# The tests start their own instances on free loopback ports; the packages' services are not used.
alerting-stack:
	$(call apt_install,prometheus-alertmanager:prometheus-alertmanager prometheus:prometheus,needed by the alerting tests)

lint: $(DEV_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(DEV_STAMP)
	$(BIN)/mypy

unit: $(DEV_STAMP) browser alerting-stack
	$(BIN)/pytest -q

## test: lint, type check and the whole test suite
test: system-deps lint typecheck unit

bench: $(STAMP)
	$(BIN)/python -m bench.ingest
	$(BIN)/python -m bench.analytics
	$(BIN)/python -m bench.summaries
	$(BIN)/python -m bench.scale
	$(BIN)/python -m bench.anatomy
	$(BIN)/python -m bench.first_byte

clean:
	rm -rf $(VENV) .tailwatch demo-out .pytest_cache .mypy_cache .ruff_cache
