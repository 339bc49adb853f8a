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

.PHONY: demo test test-fast test-slow lint install kubectl browser clean

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

# The real kubectl for tests/clusters/k8s/test_k8s_kubectl.py (skipped without it, except on CI): Debian's
# kubernetes-client when no kubectl is on PATH (apt-get as root, else through sudo).
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
kubectl:
	@command -v kubectl >/dev/null 2>&1 || { \
		command -v apt-get >/dev/null 2>&1 || { echo "make kubectl: no kubectl and no apt-get: install kubectl" >&2; exit 1; }; \
		echo "installing kubectl (Debian's kubernetes-client)"; \
		$(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq --no-install-recommends kubernetes-client; }
	@kubectl version --client 2>/dev/null | head -1

demo: $(STAMP)
	$(BIN)/dl2ray demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/mypy

# The suite in two stages: every test not marked `slow` (stage 1, CI's first stage), then the slow ones
# (live clusters, Ray heads of their own, end-to-end training runs; stage 2). `make test` runs both.
# Each stage runs on TEST_WORKERS pytest-xdist processes, a test file per worker at a time (its module
# fixtures stay in one process; each worker starts its own session Ray); TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
XDIST := $(if $(filter 0,$(TEST_WORKERS)),-p no:xdist,-n $(TEST_WORKERS) --dist loadfile)

test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" $(XDIST)

test-slow: $(STAMP)
	$(BIN)/python -m pytest -m slow --durations=20 $(XDIST)

# Chromium and its driver for tests/clusters/test_dashboard_live.py (skipped without them, except on CI):
# Debian's chromium + chromium-driver when either is missing (apt-get as root, else through sudo).
browser:
	@{ command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; } || { \
		command -v apt-get >/dev/null 2>&1 || { echo "make browser: no chromium and no apt-get: install chromium and chromedriver" >&2; exit 1; }; \
		echo "installing chromium and chromium-driver (Debian's)"; \
		$(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; }
	@chromedriver --version 2>/dev/null | head -1

# The whole suite with its set-up: kubectl and chromium for the tests that drive them, lint, then the tests
# not marked slow (they must pass first: make stops at the first failing step), then the slow ones.
test: kubectl browser lint test-fast test-slow

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
