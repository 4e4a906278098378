# The two README commands. Both set up everything a fresh machine lacks:
# a Java 17+ runtime (apt-get, only when `java` is absent or too old), the
# virtualenv .venv and the package with its dev extras.
#
#   make demo   broker + producer + Spark sensor pipeline, results on the console
#   make test   the whole test suite (what .ci/run runs)

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.npstream-installed
PYTEST_ARGS ?=

.PHONY: demo test setup java lint proto clean

demo: setup
	$(PY) examples/sensor_pipeline/run_demo.py

test: setup
	$(PY) -m ruff check .
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) -m pytest $(PYTEST_ARGS)

setup: java $(STAMP)

java:
	@if ! java -version 2>&1 | grep -qE 'version "(1[7-9]|[2-9][0-9])'; then \
		echo "installing a Java 17+ runtime (apt-get)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless >/dev/null; \
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

lint: setup
	$(PY) -m ruff check .

proto: setup
	$(PY) proto/generate.py

clean:
	rm -rf $(VENV) build dist *.egg-info data
