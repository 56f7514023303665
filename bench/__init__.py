"""Benchmarks of django-zerodb (``make bench``); results go to ``bench/results/``."""
