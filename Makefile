# walstream workspace. `make run` and `make test` install what they need first (idempotently):
# `make run` only what the demo needs (see RUN_DISTS), `make test` everything (`make install`).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Every dist of the workspace, core first (the others depend on it).
DISTS := core plugins $(sort $(filter-out core/ plugins/,$(dir $(wildcard */pyproject.toml))))
# prometheus: for promtool, which checks deploy/prometheus (tests/test_operations.py); its
# service is not started.
DEBIAN_PACKAGES := libaio1 fio postgresql redis-server nats-server kcat prometheus
STAMP := $(VENV)/.installed
# S2's TypeScript SDK for tests/test_typescript_sdk.py (clients/node, from its package-lock.json).
NODE_PROJECT := clients/node
NODE_STAMP := $(NODE_PROJECT)/node_modules/.installed

.PHONY: install run test test-fast test-full lint docs bench clean dist

install: $(STAMP) $(NODE_STAMP)

$(STAMP): pyproject.toml $(wildcard */pyproject.toml) Makefile
	@missing=""; for pkg in $(DEBIAN_PACKAGES); do \
	  dpkg -s $$pkg >/dev/null 2>&1 || missing="$$missing $$pkg"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]' -e './core[server]' $(foreach d,$(filter-out core,$(DISTS)),-e ./$(d))
	@# An editable install skips walstream-spark.pth, which spark/setup.py ships in the wheel.
	@cp spark/src/walstream-spark.pth "$$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/"
	@touch $(STAMP)

$(NODE_STAMP): $(NODE_PROJECT)/package.json $(NODE_PROJECT)/package-lock.json
	@if ! command -v npm >/dev/null 2>&1; then \
	  echo "installing Node.js and npm (Debian packages nodejs npm)"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq nodejs npm; \
	fi
	cd $(NODE_PROJECT) && npm ci --no-audit --no-fund --loglevel=error
	@touch $@

# The demo needs only Debian's libaio1 (the ebs WAL of the embedded default) and three dists:
# core, the plugin host and the ebs WAL. After `make install` (everything, for the tests) it
# installs nothing more.
RUN_STAMP := $(VENV)/.installed-run
RUN_DISTS := core plugins wal_ebs

run: $(RUN_STAMP)
	$(VENV)/bin/walstream demo

$(RUN_STAMP): $(foreach d,$(RUN_DISTS),$(d)/pyproject.toml)
	@if [ -f $(STAMP) ]; then touch $@; exit 0; fi; \
	echo "make run installs what the demo needs: Debian's libaio1 and walstream ($(RUN_DISTS)) in $(VENV); make install adds the rest (PostgreSQL, Redis, NATS, Prometheus, Node.js and every dist, for the tests)"; \
	if ! dpkg -s libaio1 >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq libaio1; \
	fi; \
	test -x $(PY) || $(PYTHON) -m venv $(VENV); \
	$(PY) -m pip install -q --upgrade pip && \
	$(PY) -m pip install -q $(foreach d,$(RUN_DISTS),-e ./$(d)) && touch $@

# ruff on every dist, tools and bench; mypy --strict on core, on every dist's src/, tools/docs
# and bench/ (its scripts import bench/common as the top-level package `common`, as they do when
# run); import-linter checks the dependency rules of the root pyproject.toml ([tool.importlinter]).
lint: install
	$(VENV)/bin/ruff check core plugins $(filter-out core/ plugins/,$(DISTS)) tools bench
	$(VENV)/bin/mypy core/src/walstream
	@set -e; for d in $(filter-out core,$(patsubst %/,%,$(DISTS))); do \
	  echo "mypy --strict $$d/src"; $(VENV)/bin/mypy --strict $$d/src; done
	$(VENV)/bin/mypy --strict tools/docs
	$(VENV)/bin/mypy --strict bench
	$(VENV)/bin/lint-imports

# The documentation site (mkdocs.yml) into build/site; --strict: any warning (a broken link, a
# page the generated reference cannot describe) fails. The Material theme's notice about MkDocs 2
# is silenced: mkdocs is pinned below 2 in the root pyproject.
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

# The suite runs on TEST_WORKERS pytest-xdist processes (0: in this process). Most tests wait on
# child processes and sockets, so 3 workers keep 2 cores busy; a test file is one unit of work
# (its module fixtures start once) and Spark's tests share one worker (conftest.py).
TEST_WORKERS ?= 3
PYTEST_PARALLEL = -n $(TEST_WORKERS) --dist loadfile
# make test warns when install, lint, docs and the suite together take longer (a noisy machine
# is no reason to refuse a change, so the status stays the suite's).
TEST_BUDGET_S := 1200
MAKE_STARTED := $(shell date +%s)

# Lint, the docs site and the whole suite, with the 25 slowest tests and the total time.
test: install lint docs
	@echo "$(VENV)/bin/pytest -q -ra $(PYTEST_PARALLEL) --durations=25"; \
	status=0; $(VENV)/bin/pytest -q -ra $(PYTEST_PARALLEL) --durations=25 || status=$$?; \
	elapsed=$$(( $$(date +%s) - $(MAKE_STARTED) )); \
	echo "make test: $$elapsed s in all (install, lint, docs and the suite; CI budget $(TEST_BUDGET_S) s)"; \
	if [ "$$elapsed" -gt $(TEST_BUDGET_S) ]; then \
	  echo "make test: OVER THE CI BUDGET: $$elapsed s > $(TEST_BUDGET_S) s. Bound the slowest tests" \
	    "above in CI (full length under --soak) or mark what is new slow; docs/contributing/tests.md"; \
	fi; \
	exit $$status

# The inner loop, without lint or docs: every test not marked slow (unit tests and a smoke test
# per dist), in under 3 minutes on 2 cores.
test-fast: install
	$(VENV)/bin/pytest -q -ra -m "not slow" $(PYTEST_PARALLEL) --durations=10

test-full: install lint docs
	$(VENV)/bin/pytest -q -ra --soak $(PYTEST_PARALLEL) --durations=25

bench: install
	$(PY) bench/run_all.py

# Wheels and sdists of every dist into dist/, built with the venv's setuptools (no isolated
# build environment: nothing downloaded). Install from them outside the checkout with
# pip install --find-links dist 'walstream[server,s3,postgres]'.
dist: install
	rm -rf dist
	@set -e; for d in $(patsubst %/,%,$(DISTS)); do \
	  $(PY) -m build --no-isolation --outdir dist $$d > $(VENV)/dist.log 2>&1 || { cat $(VENV)/dist.log; exit 1; }; \
	  echo "built $$d"; done
	@ls dist

clean:
	rm -rf $(VENV) walstream-data build/site dist
