"""Measurements, not tests: each script runs as `python -m benchmarks.NAME` from the repository
root. The real data and models they build (real_data.py, task_data.py, cantonese_bert.py) are
shared with the tests, which import them from here."""
