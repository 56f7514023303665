# django-zerodb: everything a newcomer needs is `make demo` and `make test`.
# Both create (once) and reuse .venv and install the package with its dev extras.

VENV      := .venv
PY        := $(VENV)/bin/python
STAMP     := $(VENV)/.installed
SOURCES   := $(wildcard zerodb_core blob_server django_zerodb example_project tests bench)

.PHONY: demo test lint format bench fuzz clean help

help:
	@echo "make demo   install and run the demo on the embedded store"
	@echo "make test   install and run the whole test suite (lint included)"
	@echo "make bench  run the benchmarks (slow; results in bench/results/)"
	@echo "make fuzz   fuzz the blob server for a long time (ZERODB_FUZZ_EXAMPLES=200000)"
	@echo "make format apply ruff format and autofixes"

$(PY):
	@PYTHON_BIN=$$(scripts/find-python) || exit 1; \
	echo "creating $(VENV) with $$PYTHON_BIN"; \
	"$$PYTHON_BIN" -m venv $(VENV)

$(STAMP): $(PY) setup.cfg pyproject.toml
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m zerodb_core.demo

lint: $(STAMP)
	$(VENV)/bin/ruff format --check $(SOURCES)
	$(VENV)/bin/ruff check $(SOURCES)

format: $(STAMP)
	$(VENV)/bin/ruff format $(SOURCES)
	$(VENV)/bin/ruff check --fix $(SOURCES)

test: $(STAMP) lint
	$(PY) -m pytest -m "not slow" -n 2 --dist loadgroup -q

bench: $(STAMP)
	$(PY) -m bench.native_load
	$(PY) -m bench.server_vs_redis

fuzz: $(STAMP)
	ZERODB_FUZZ_EXAMPLES=$${ZERODB_FUZZ_EXAMPLES:-200000} $(PY) -m pytest tests/server/test_fuzz.py -q -m slow

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis build *.egg-info
