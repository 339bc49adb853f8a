# The two commands of the README: `make demo` and `make test`.
# Both create .venv if it is missing and (re)install the project when
# pyproject.toml changed. uv is used with the local torch CPU wheel when
# /opt/wheels exists (seconds instead of minutes); plain pip otherwise.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
WHEELS := /opt/wheels

export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER := 0
export RAY_USAGE_STATS_ENABLED := 0

.PHONY: demo test test-fast test-slow lint install browser clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	@if [ -d $(WHEELS) ]; then \
		$(BIN)/pip install -q uv && \
		$(BIN)/uv pip install --python $(BIN)/python --find-links $(WHEELS) -e '.[dev]'; \
	else \
		$(BIN)/pip install -q -e '.[dev]'; \
	fi
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/dl2ray demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/mypy

# The suite in two stages: every test not marked `slow` (stage 1, CI's first stage), then the slow ones
# (live clusters, Ray heads of their own, end-to-end training runs; stage 2). `make test` runs both.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow"

test-slow: $(STAMP) browser
	$(BIN)/python -m pytest -m slow

# The dashboard's browser test (tests/clusters/test_dashboard_live.py) drives Debian's chromium through its
# chromedriver; installed here when missing (as root, as CI runs), else the test says how.
browser:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; \
	else echo "make browser: chromium/chromedriver missing (apt-get install -y chromium chromium-driver)"; fi

test: lint test-fast test-slow

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
