# Everything a fresh clone needs is installed from here: `make demo`, `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev

.PHONY: demo test lint typecheck unit bench browser alerting-stack clean

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

## browser: Debian's Chromium for the dashboard tests and PNG export, when missing
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing Debian's chromium (needed by the dashboard tests)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

## alerting-stack: Debian's Alertmanager and Prometheus for the alerting tests, when missing
# The tests start their own instances on free loopback ports; the packages' services are not used.
alerting-stack:
	@command -v prometheus-alertmanager >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 || { \
	  echo "installing Debian's prometheus-alertmanager and prometheus (needed by the alerting tests)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    prometheus-alertmanager prometheus >/dev/null; }

lint: $(DEV_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(DEV_STAMP)
	$(BIN)/mypy

unit: $(DEV_STAMP) browser alerting-stack
	$(BIN)/pytest -q

## test: lint, type check and the whole test suite
test: lint typecheck unit

bench: $(STAMP)
	$(BIN)/python -m bench.ingest
	$(BIN)/python -m bench.analytics

clean:
	rm -rf $(VENV) .tailwatch demo-out .pytest_cache .mypy_cache .ruff_cache
