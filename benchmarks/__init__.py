"""Measurements, not tests. Each script runs from the repository root as

    python -m benchmarks.NAME [--json=PATH] ...

and says in its docstring (and --help) what it measures and the commands behind the published
figures. harness.py is what they share: flags, the machine line (measured in the same run),
timing, and the record --json writes, which `python -m benchmarks.render PATH` prints as the
markdown tables again. The real data and models the benchmarks build (real_data.py,
task_data.py, cantonese_bert.py) are shared with the tests, which import them from here.
"""
