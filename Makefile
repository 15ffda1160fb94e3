# Alineo — `make run` serves, `make test` runs the suite. Both set up from a
# fresh clone: virtualenv, dependencies (re-installed when pyproject.toml
# changes), migrations.

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
# Touched after a successful install; older than pyproject.toml means reinstall.
STAMP  := $(VENV)/.alineo-installed
HOST   ?= 127.0.0.1
PORT   ?= 8000
PYTEST_ARGS ?=

.PHONY: help setup run test migrate bench clean

help:
	@echo "make run      set up, migrate, ensure the admin user, serve on http://$(HOST):$(PORT)/"
	@echo "make test     set up and run the whole test suite (isolated ALINEO_DATA_DIR)"
	@echo "make migrate  apply database migrations (to ALINEO_DATA_DIR, default ./var)"
	@echo "make bench    run bench/run if present"
	@echo "make clean    remove the virtualenv and caches (keeps ./var, your data)"

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	@echo "Installing Alineo and its test extra into $(VENV) (the first time takes a minute)"
	$(PY) -m pip install --disable-pip-version-check --quiet -e '.[test]'
	touch $@

setup: $(STAMP)

migrate: setup
	$(PY) manage.py migrate --noinput

# With a Docker engine answering (and ALINEO_SANDBOX not forcing local), build
# the sandbox base image first (skipped in 0.04 s when it exists). A failed build
# only warns: the server still serves, and the local backend does not need it.
run: migrate
	$(PY) manage.py ensure_admin
	if [ "$${ALINEO_SANDBOX:-auto}" != local ] && [ -f sandboxes/management/commands/build_base_image.py ] \
	   && command -v docker >/dev/null && docker info >/dev/null 2>&1; then \
	  $(PY) manage.py build_base_image || echo "warning: the sandbox base image was not built (see above)" >&2; \
	fi
	exec $(PY) manage.py serve --host $(HOST) --port $(PORT)

# Tests get a throwaway data dir, so they never touch ./var. pytest's exit
# status is the recipe's: the EXIT trap does not change it.
# As root (CI, a fresh machine) the Docker engine is installed and started first
# (.ci/docker-up: docker.io + mmdebstrap, dockerd without a bridge network), so
# the docker backend is exercised for real; then the base image is built once.
# Debian's chromium is installed too when missing (.ci/browser-up), for tests/browser.
test: setup
	if [ "$$(id -u)" = 0 ] && [ "$${ALINEO_SANDBOX:-auto}" != local ]; then bash .ci/docker-up; fi
	if [ "$$(id -u)" = 0 ] && [ ! -x /usr/bin/chromium ]; then bash .ci/browser-up; fi
	if command -v docker >/dev/null && docker info >/dev/null 2>&1; then \
	  ALINEO_DATA_DIR=$$(mktemp -d) $(PY) manage.py build_base_image; \
	fi
	data_dir=$$(mktemp -d "$${TMPDIR:-/tmp}/alineo-test.XXXXXX"); \
	trap 'rm -rf "$$data_dir"' EXIT; \
	ALINEO_DATA_DIR="$$data_dir" $(PY) -m pytest $(PYTEST_ARGS)

# Benchmarks also get a throwaway data dir unless ALINEO_DATA_DIR is set.
# bench/run may be executable (any language), a shell script (#!…sh) or Python.
bench: setup
	if [ ! -e bench/run ]; then echo "bench/run not present: nothing to run"; exit 0; fi; \
	data_dir=$${ALINEO_DATA_DIR:-$$(mktemp -d "$${TMPDIR:-/tmp}/alineo-bench.XXXXXX")}; \
	if [ -z "$${ALINEO_DATA_DIR:-}" ]; then trap 'rm -rf "$$data_dir"' EXIT; fi; \
	export ALINEO_DATA_DIR="$$data_dir" PATH="$(CURDIR)/$(VENV)/bin:$$PATH"; \
	if [ -x bench/run ]; then bench/run; \
	elif head -n1 bench/run | grep -Eq '^#!.*[/ ](ba)?sh'; then bash bench/run; \
	else $(PY) bench/run; fi

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis bench/results *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
