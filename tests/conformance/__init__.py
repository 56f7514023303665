"""Settings and a recording test runner for running Django's own test suite against our
backend (``python -m bench.conformance``). Nothing here is collected by pytest."""
