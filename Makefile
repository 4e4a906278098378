# The two README commands. Both set up everything a fresh machine lacks:
# a Java 17+ runtime (apt-get, only when `java` is absent or too old), a
# headless Chromium for the web console's browser tests (Debian's `chromium`,
# apt-get, only when absent), etcd for clusters of brokers and their tests
# (Debian's `etcd-server`, apt-get, only when `etcd` is absent), the virtualenv .venv and the package with its
# dev extras.
#
#   make demo   broker + producer + Spark sensor pipeline, results on the console
#   make test   the whole test suite (what .ci/run runs)
#
# For the edit-test loop:
#   make test-fast  the unit tests only: no broker process, no Spark, no etcd, no
#               browser, no slow test (-m "not integration and not slow"; about a
#               minute and a half on 2 shared cores). A test is marked integration
#               from its code, not by a list: tests/conftest.py marks every test
#               whose code, fixtures or module imports start a process
#               (tests/support/integration_marks.py). Needs only the virtualenv;
#               `make test-fast PYTEST_ARGS=--lf` reruns the last failures.
#
# Generated files, checked in (a test fails when one is stale):
#   make proto  the gRPC code from proto/npstream/v1/*.proto, and docs/client.md's
#               error reason table (proto/generate.py); the broker's etcd client
#               stubs from etcd's protos in broker/cluster/etcd/pb (proto/generate_etcd.py)
#   make docs   conf/broker.toml and docs/broker.md's key tables from the broker's
#               key table (KEYS); docs/spark.md's option tables and the DataSource
#               docstring's option lists from the Spark option tables (READ_SPECS,
#               WRITE_SPECS) (docs/generate.py)

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.npstream-installed
PYTEST_ARGS ?=
TYPECHECK_TREE := build/typecheck

.PHONY: demo test test-fast setup java chromium etcd lint typecheck-tree proto docs clean

demo: setup
	$(PY) examples/sensor_pipeline/run_demo.py --brokers $(or $(BROKERS),1)

test: setup lint
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) -m pytest $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(PY) -m pytest -m "not integration and not slow" $(PYTEST_ARGS)

setup: java chromium etcd $(STAMP)

java:
	@if ! java -version 2>&1 | grep -qE 'version "(1[7-9]|[2-9][0-9])'; then \
		echo "installing a Java 17+ runtime (apt-get)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless >/dev/null; \
	fi

# tests/broker/console drive a real headless Chromium (tests/support/browser.py).
chromium:
	@if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then \
		echo "installing a headless Chromium for the web console tests (apt-get)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	fi

# A cluster of brokers coordinates through etcd (`npstream broker --etcd`,
# `npstream cluster local`); the cluster tests start a real one (the `etcd` fixture, npstream.cli.local_etcd).
etcd:
	@if ! command -v etcd >/dev/null 2>&1; then \
		echo "installing etcd for clusters of brokers (apt-get etcd-server)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server >/dev/null; \
	fi

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@# The editable install's meta path finder makes setuptools print an
	@# informational "Editable installation." notice; it is not a warning about
	@# this project's configuration, so it is filtered (and only it).
	PYTHONWARNINGS="ignore:Editable installation" $(PY) -m pip install -q -e '.[dev]'
	@# Spark finds data sources by listing top-level pyspark_* modules on sys.path
	@# (pkgutil.iter_modules), which cannot see modules served by the editable
	@# install's import hook; this .pth puts connector/discovery on sys.path so
	@# format("npstream") works in spark-submit and notebooks run from the tree.
	$(PY) -c "import pathlib, sysconfig; pathlib.Path(sysconfig.get_paths()['purelib'], 'npstream-discovery.pth').write_text('$(abspath connector/discovery)\\n')"
	@touch $(STAMP)

# ruff, the layer contracts (import-linter, [tool.importlinter]) and mypy
# ([tool.mypy]); the last two read the installed import names through a link
# tree, because setuptools' package-dir mapping is not a folder layout they walk.
lint: setup typecheck-tree
	$(PY) -m ruff check .
	PYTHONPATH=$(TYPECHECK_TREE) $(VENV)/bin/lint-imports --no-cache
	$(PY) -m mypy

typecheck-tree:
	@rm -rf $(TYPECHECK_TREE) && mkdir -p $(TYPECHECK_TREE)/npstream
	@for f in connector/*; do case "$${f##*/}" in discovery|__pycache__|*.egg-info) ;; \
		*) ln -s "$(abspath .)/$$f" $(TYPECHECK_TREE)/npstream/ ;; esac; done
	@ln -s $(abspath broker) $(TYPECHECK_TREE)/npstream/broker
	@ln -s $(abspath proto) $(TYPECHECK_TREE)/npstream/proto

proto: setup
	$(PY) proto/generate.py
	$(PY) proto/generate_etcd.py

docs: setup
	$(PY) docs/generate.py

clean:
	rm -rf $(VENV) build dist *.egg-info data
