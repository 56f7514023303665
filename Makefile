# django-zerodb: everything a newcomer needs is `make demo` and `make test`.
# Both create (once) and reuse .venv and install the package with its dev extras.

VENV      := .venv
PY        := $(VENV)/bin/python
STAMP     := $(VENV)/.installed
SOURCES   := $(wildcard zerodb_core blob_server django_zerodb example_project tests bench)

.PHONY: demo demo-native test system-deps lint format bench conformance fuzz matrix clean help

help:
	@echo "make demo   install and run the example HR site (Django admin, encrypted store)"
	@echo "make demo-native  the engine's native-API demo (no Django)"
	@echo "make test   install and run the whole test suite (lint included)"
	@echo "make bench  run the benchmarks (slow; results in bench/results/)"
	@echo "make conformance  run Django's own tests against django_zerodb (docs/conformance.md;"
	@echo "            CONFORMANCE_BASELINE=1 reruns SQLite, CONFORMANCE_APPS=\"basic lookup\" a subset)"
	@echo "make fuzz   fuzz the blob server for a long time (ZERODB_FUZZ_EXAMPLES=200000)"
	@echo "make matrix the Django tests on each supported Django x Python 3.12/3.13 (nox; slow;"
	@echo "            MATRIX_ARGS=\"-s tests-3.13(django='6.1')\" picks one)"
	@echo "make format apply ruff format and autofixes"

$(PY):
	@PYTHON_BIN=$$(scripts/find-python) || exit 1; \
	echo "creating $(VENV) with $$PYTHON_BIN"; \
	"$$PYTHON_BIN" -m venv $(VENV)

$(STAMP): $(PY) setup.cfg pyproject.toml
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,example]'
	@touch $(STAMP)

install: $(STAMP)

# The example HR site (example_project/): migrate, seed once, run on 127.0.0.1:8000.
# DEMO_ARGS passes options to demo.py, e.g. make demo DEMO_ARGS="--addr 127.0.0.1:8080".
demo: $(STAMP)
	$(PY) example_project/demo.py $(DEMO_ARGS)

demo-native: $(STAMP)
	$(PY) -m zerodb_core.demo

lint: $(STAMP)
	$(VENV)/bin/ruff format --check $(SOURCES)
	$(VENV)/bin/ruff check $(SOURCES)

format: $(STAMP)
	$(VENV)/bin/ruff format $(SOURCES)
	$(VENV)/bin/ruff check --fix $(SOURCES)

# redis-server, Chromium and curl: installed with apt-get when missing (root or sudo),
# else one line says what to install (scripts/system-deps).
system-deps:
	@scripts/system-deps

test: system-deps $(STAMP) lint
	$(PY) -m pytest -m "not slow" -n 2 --dist loadgroup -q

bench: $(STAMP)
	$(PY) -m bench.native_load
	$(PY) -m bench.write_cost
	$(PY) -m bench.server_vs_redis
	$(PY) -m bench.proxy_floor
	$(PY) -m bench.django_side_by_side
	$(PY) -m bench.indexes
	$(PY) -m bench.scale_out
	$(PY) -m bench.capacity

# Django's own test suite as an outside judge (docs/conformance.md). The SQLite baseline
# runs only when its results are missing or with CONFORMANCE_BASELINE=1.
CONFORMANCE_APPS_ARG = $(if $(CONFORMANCE_APPS),--apps "$(CONFORMANCE_APPS)")

# Django's optional test packages (setup.cfg's `conformance` extra), once.
CONFORMANCE_STAMP := $(VENV)/.conformance-installed

$(CONFORMANCE_STAMP): $(STAMP) setup.cfg
	$(PY) -m pip install --quiet -e '.[dev,example,conformance]'
	@touch $(CONFORMANCE_STAMP)

conformance: $(CONFORMANCE_STAMP)
	@if [ "$(CONFORMANCE_BASELINE)" = 1 ] || [ ! -f bench/results/conformance-sqlite.json ]; then \
		echo "SQLite baseline: $(PY) -m bench.conformance --backend sqlite --no-doc"; \
		$(PY) -m bench.conformance --backend sqlite --no-doc $(CONFORMANCE_APPS_ARG) || exit 1; \
	fi
	$(PY) -m bench.conformance --backend zerodb $(CONFORMANCE_APPS_ARG)

fuzz: $(STAMP)
	ZERODB_FUZZ_EXAMPLES=$${ZERODB_FUZZ_EXAMPLES:-200000} $(PY) -m pytest tests/server/test_fuzz.py -q -m slow

# Each supported Django on Python 3.12 and 3.13, each in its own virtualenv under .nox/
# (noxfile.py, which says why Django 5.2 and 6.0 are not among them yet).
matrix: $(STAMP)
	$(VENV)/bin/nox $(MATRIX_ARGS)

clean:
	rm -rf $(VENV) .nox .pytest_cache .ruff_cache .hypothesis build *.egg-info
