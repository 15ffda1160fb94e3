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
# The PostgreSQL + Redis pass of `make test` (the scale-out shape) runs these.
PG_PYTEST_ARGS ?= tests/unit tests/scaleout -m "not sqlite_only"
# tests/unit is CPU-bound and self-contained: it runs on this many pytest-xdist
# workers (1: in this process).
UNIT_JOBS ?= 2
# The live suites (servers, sandboxes, browsers) run on this many xdist workers,
# a test file to a worker (--dist loadfile keeps a module's server on one), each
# with its own ALINEO_DATA_DIR so its clean-up never touches another's sandboxes.
LIVE_JOBS ?= 3
# 1: the PostgreSQL pass runs its unit tests beside tests/scaleout (see `test`).
PG_UNIT_BESIDE ?= 0

.PHONY: help setup run test migrate bench mutants clean

help:
	@echo "make run      set up, migrate, ensure the admin user, serve on http://$(HOST):$(PORT)/"
	@echo "make test     set up and run the whole test suite (isolated ALINEO_DATA_DIR) on SQLite,"
	@echo "              then tests/unit + tests/scaleout on PostgreSQL + Redis (as root, or ALINEO_TEST_PG=1)"
	@echo "make migrate  apply database migrations (to ALINEO_DATA_DIR, default ./var)"
	@echo "make bench    run bench/run if present"
	@echo "make mutants  the mutation check: deliberate bugs, one at a time, and the tests that must catch them"
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
# As root, bubblewrap (the local backend's sandbox) is installed when missing
# (.ci/bwrap-up); a failure only warns: with Docker, or ALINEO_SANDBOX=unisolated,
# it is not needed, and without either the server says why it cannot spawn.
run: migrate
	$(PY) manage.py ensure_admin
	if [ "$$(id -u)" = 0 ] && ! command -v bwrap >/dev/null; then \
	  bash .ci/bwrap-up || echo "warning: bubblewrap was not installed (see above)" >&2; \
	fi
	if [ "$${ALINEO_SANDBOX:-auto}" != local ] && [ "$${ALINEO_SANDBOX:-auto}" != unisolated ] \
	   && command -v docker >/dev/null && docker info >/dev/null 2>&1; then \
	  $(PY) manage.py build_base_image || echo "warning: the sandbox base image was not built (see above)" >&2; \
	fi
	exec $(PY) manage.py serve --host $(HOST) --port $(PORT)

# Tests get a throwaway data dir, so they never touch ./var.
# As root (CI, a fresh machine) the Docker engine is installed and started first
# (.ci/docker-up: docker.io + mmdebstrap, dockerd without a bridge network), so
# the docker backend is exercised for real; then the base image is built once.
# Debian's chromium is installed too when missing (.ci/browser-up), for tests/browser,
# and bubblewrap (.ci/bwrap-up), for the local backend and tests/security.
#
# Two passes; `make test` fails when either fails:
#   1. the whole suite ($(PYTEST_ARGS)) but tests/scaleout on SQLite and the
#      in-memory channel layer (DATABASE_URL/REDIS_URL from your shell are ignored);
#      by default tests/unit first on $(UNIT_JOBS) xdist workers, then the rest
#      on $(LIVE_JOBS);
#   2. $(PG_PYTEST_ARGS) on PostgreSQL + Redis (DATABASE_URL, REDIS_URL): the
#      unit tests that can reach the database again (less those marked
#      sqlite_only, which ran in pass 1; tests/conftest.py leaves out those with
#      no django_db marker or db fixture: pytest-django refuses them any query,
#      so they run the same code on every engine) and the scale-out tests, which
#      need several processes on one database (with tests/scaleout/
#      test_faults_pg.py: kill -9, sandbox loss, backup/restore). With
#      PG_UNIT_BESIDE=1 (and UNIT_JOBS > 1) the two run side by side (the unit
#      tests on xdist workers, with their own test databases test_*_gwN, Redis
#      database 15 and data dir; their output printed after the scale-out
#      tests'): ~1 min sooner, but the CPU-bound unit tests then starve the
#      scale-out tests' lease timing on 2 cores, so it is off by default. The
#      services come from ALINEO_TEST_DATABASE_URL + ALINEO_TEST_REDIS_URL when
#      both are set, else, as root, from .ci/services-up (Debian's postgresql and
#      redis-server on 127.0.0.1, stopped again afterwards if this run started them;
#      started in the background before pass 1, so their install overlaps it).
#      ALINEO_TEST_PG=1 requires the pass, =0 skips it; by default it runs when
#      it can and is skipped LOUDLY when it cannot — except under CI=true, where
#      a missing PostgreSQL/Redis fails `make test`.
#   tests/integration, faults and browser start their servers with the embedded
#   defaults (tests/live.py), so pass 2 would only repeat them on SQLite.
test: setup
	if [ "$$(id -u)" = 0 ] && [ "$${ALINEO_SANDBOX:-auto}" != local ]; then bash .ci/docker-up; fi
	if [ "$$(id -u)" = 0 ]; then bash .ci/bwrap-up; fi
	if [ "$$(id -u)" = 0 ] && [ ! -x /usr/bin/chromium ]; then bash .ci/browser-up; fi
	if command -v docker >/dev/null && docker info >/dev/null 2>&1; then \
	  ALINEO_DATA_DIR=$$(mktemp -d) $(PY) manage.py build_base_image; \
	fi
	@data_dir=$$(mktemp -d "$${TMPDIR:-/tmp}/alineo-test.XXXXXX"); \
	services_started=""; services_pid=""; \
	trap 'if [ -n "$$services_pid" ]; then wait "$$services_pid" || true; services_started=$$(sed -n '"'"'s/^ALINEO_SERVICES_STARTED="\(.*\)"$$/\1/p'"'"' "$$data_dir/services.env"); fi; if [ -n "$$services_started" ]; then bash .ci/services-down $$services_started || true; fi; rm -rf "$$data_dir"' EXIT; \
	case "$${CI:-}" in 1|true|TRUE|True|yes) ci=1 ;; *) ci="" ;; esac; \
	want_pg=$${ALINEO_TEST_PG:-auto}; \
	loud() { printf '\n%s\n%s\n%s\n\n' "=================================================================" "$$*" "=================================================================" >&2; }; \
	if [ "$$want_pg" != 0 ] && [ "$$(id -u)" = 0 ] \
	   && ! { [ -n "$${ALINEO_TEST_DATABASE_URL:-}" ] && [ -n "$${ALINEO_TEST_REDIS_URL:-}" ]; }; then \
	  bash .ci/services-up >"$$data_dir/services.env" 2>"$$data_dir/services.err" & services_pid=$$!; \
	fi; \
	echo "== make test: the layers (lint-imports, [tool.importlinter] in pyproject.toml)"; \
	$(VENV)/bin/lint-imports --no-cache || exit $$?; \
	echo "== make test, pass 1/2: SQLite + in-memory channel layer: pytest $(PYTEST_ARGS)"; \
	sqlite_status=0; \
	mkdir -m 700 -p "$$data_dir/sqlite"; \
	pass1() { env -u DATABASE_URL -u REDIS_URL ALINEO_TEST_PASS=sqlite ALINEO_DATA_DIR="$$data_dir/sqlite" $(PY) -m pytest "$$@"; }; \
	if [ -n "$(strip $(PYTEST_ARGS))" ]; then \
	  pass1 --ignore=tests/scaleout $(PYTEST_ARGS) || sqlite_status=$$?; \
	else \
	  pass1 tests/unit $(if $(filter-out 1,$(UNIT_JOBS)),-n $(UNIT_JOBS)) || sqlite_status=$$?; \
	  live_dist=""; \
	  if [ "$(LIVE_JOBS)" != 1 ]; then \
	    live_dist="--dist loadfile"; \
	    for i in $$(seq $(LIVE_JOBS)); do \
	      mkdir -m 700 -p "$$data_dir/sqlite/live$$i"; \
	      live_dist="$$live_dist --tx popen//env:ALINEO_DATA_DIR=$$data_dir/sqlite/live$$i"; \
	    done; \
	  fi; \
	  pass1 --ignore=tests/scaleout --ignore=tests/unit --durations=25 $$live_dist || { s=$$?; [ "$$sqlite_status" != 0 ] || sqlite_status=$$s; }; \
	fi; \
	pg_status=skipped; db_url=""; redis_url=""; \
	if [ "$$want_pg" = 0 ]; then \
	  loud "make test: the PostgreSQL + Redis pass is SKIPPED (ALINEO_TEST_PG=0)"; \
	elif [ -n "$${ALINEO_TEST_DATABASE_URL:-}" ] && [ -n "$${ALINEO_TEST_REDIS_URL:-}" ]; then \
	  db_url=$$ALINEO_TEST_DATABASE_URL; redis_url=$$ALINEO_TEST_REDIS_URL; \
	elif [ "$$(id -u)" = 0 ]; then \
	  services_ok=0; wait "$$services_pid" || services_ok=$$?; services_pid=""; \
	  cat "$$data_dir/services.err" >&2; \
	  if [ "$$services_ok" = 0 ]; then \
	    db_url=$$(sed -n 's/^DATABASE_URL=//p' "$$data_dir/services.env"); \
	    redis_url=$$(sed -n 's/^REDIS_URL=//p' "$$data_dir/services.env"); \
	    services_started=$$(sed -n 's/^ALINEO_SERVICES_STARTED="\(.*\)"$$/\1/p' "$$data_dir/services.env"); \
	  else \
	    pg_status=1; loud "make test: .ci/services-up FAILED: no PostgreSQL + Redis pass (see above)"; \
	  fi; \
	elif [ -n "$$ci" ] || [ "$$want_pg" = 1 ]; then \
	  pg_status=1; \
	  loud "make test: the PostgreSQL + Redis pass cannot run: not root (for .ci/services-up) and ALINEO_TEST_DATABASE_URL / ALINEO_TEST_REDIS_URL are not set. It is required (CI=true or ALINEO_TEST_PG=1): FAILING."; \
	else \
	  loud "make test: the PostgreSQL + Redis pass is SKIPPED: not root (for .ci/services-up) and ALINEO_TEST_DATABASE_URL / ALINEO_TEST_REDIS_URL are not set. CI runs it."; \
	fi; \
	if [ -n "$$db_url" ]; then \
	  echo "== make test, pass 2/2: PostgreSQL + Redis: pytest $(PG_PYTEST_ARGS)"; \
	  mkdir -m 700 -p "$$data_dir/pg"; pg_status=0; \
	  pass2() { DATABASE_URL="$$db_url" REDIS_URL="$$redis_url" ALINEO_TEST_PASS=postgresql ALINEO_DATA_DIR="$$data_dir/pg" $(PY) -m pytest "$$@"; }; \
	  if [ '$(PG_PYTEST_ARGS)' = 'tests/unit tests/scaleout -m "not sqlite_only"' ] && { [ "$(UNIT_JOBS)" = 1 ] || [ "$(PG_UNIT_BESIDE)" != 1 ]; }; then \
	    pass2 tests/unit -m "not sqlite_only" $(if $(filter-out 1,$(UNIT_JOBS)),-n $(UNIT_JOBS)) || pg_status=$$?; \
	    pass2 tests/scaleout -m "not sqlite_only" || { s=$$?; [ "$$pg_status" != 0 ] || pg_status=$$s; }; \
	  elif [ '$(PG_PYTEST_ARGS)' = 'tests/unit tests/scaleout -m "not sqlite_only"' ]; then \
	    unit_redis=$$(printf '%s' "$$redis_url" | sed -E 's#(://[^/]*)(/[0-9]*)?$$#\1/15#'); \
	    mkdir -m 700 -p "$$data_dir/pg-unit"; \
	    ( DATABASE_URL="$$db_url" REDIS_URL="$$unit_redis" ALINEO_TEST_PASS=postgresql ALINEO_DATA_DIR="$$data_dir/pg-unit" \
	      $(PY) -m pytest tests/unit -m "not sqlite_only" -n $(UNIT_JOBS) >"$$data_dir/pg-unit.log" 2>&1 ) & unit_pid=$$!; \
	    pass2 tests/scaleout -m "not sqlite_only" || pg_status=$$?; \
	    unit_status=0; wait "$$unit_pid" || unit_status=$$?; \
	    echo "== make test, pass 2/2: the unit tests on PostgreSQL (they ran beside tests/scaleout):"; \
	    cat "$$data_dir/pg-unit.log"; \
	    [ "$$unit_status" = 0 ] || [ "$$pg_status" != 0 ] || pg_status=$$unit_status; \
	  else \
	    pass2 $(PG_PYTEST_ARGS) || pg_status=$$?; \
	  fi; \
	fi; \
	echo "== make test: SQLite pass: $$( [ $$sqlite_status = 0 ] && echo passed || echo "FAILED ($$sqlite_status)" ); PostgreSQL + Redis pass: $$( case $$pg_status in 0) echo passed ;; skipped) echo SKIPPED ;; *) echo "FAILED ($$pg_status)" ;; esac )"; \
	if [ "$$sqlite_status" != 0 ]; then exit "$$sqlite_status"; fi; \
	if [ "$$pg_status" != 0 ] && [ "$$pg_status" != skipped ]; then exit "$$pg_status"; fi

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

# Not part of `make test`: each mutant patches core code, runs the tests that
# should catch it and restores the file (bench/mutants --list shows them).
mutants: setup
	$(PY) bench/mutants $(MUTANTS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis bench/results *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
