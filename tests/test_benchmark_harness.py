"""The benchmarks' harness: the record --json writes holds every table's figures unformatted,
with the exact command and the machine, and renders back to the tables the run printed."""
import json
import sys
import types

import numpy as np
import pytest

from benchmarks import harness, render


@pytest.fixture
def as_benchmark(monkeypatch, tmp_path):
    """The process as `python -m benchmarks.example --json=PATH --size=base` starts it."""
    path = tmp_path / "record.json"
    main = types.ModuleType("__main__")
    main.__spec__ = types.SimpleNamespace(name="benchmarks.example")
    monkeypatch.setitem(sys.modules, "__main__", main)
    monkeypatch.setattr(sys, "argv", ["example.py", f"--json={path}", "--size=base"])
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    return path


def test_the_record_renders_the_tables_the_run_printed(as_benchmark, capsys):
    parser = harness.parser("What it measures.\n\n  python -m benchmarks.example\n")
    parser.add_argument("--size", default="mini")
    bench = harness.start(parser.parse_args(), peak=False)
    speeds = bench.table("speeds", [("step", ""), ("seq/s", ".1f"), ("tokens", ",d")])
    speeds.row("pretrain", 1234.56, 12345)
    speeds.row("finetune", np.float32(2.5), None)  # a NumPy figure; a cell left empty
    bench.figure("flops", np.float64(3e9))
    bench.finish()
    printed = capsys.readouterr().out

    record = json.loads(as_benchmark.read_text())
    assert record["command"] == (f"python -m benchmarks.example --json={as_benchmark} "
                                 "--size=base")
    assert record["machine"]["cpu"]["cores"] >= 1 and "peak_flops" not in record["machine"]
    (table,) = record["tables"]
    assert table["rows"] == [["pretrain", 1234.56, 12345], ["finetune", 2.5, None]]
    assert record["figures"] == {"flops": 3e9}
    assert "| pretrain | 1234.6 | 12,345 |\n| finetune | 2.5 |  |" in printed
    assert harness.markdown(table) in printed
    assert harness.markdown(table) in render.render(record)
    assert f"`{record['command']}`" in render.render(record)


def test_a_row_of_the_wrong_width_is_refused(as_benchmark, capsys):
    bench = harness.start(harness.parser("Doc.").parse_args([]), peak=False)
    table = bench.table("speeds", [("step", ""), ("seq/s", ".1f")])
    with pytest.raises(ValueError, match="1 values for the 2 columns of table 'speeds'"):
        table.row("pretrain")


def test_the_machine_line_carries_the_peak_measured_now():
    found = harness.machine()
    assert found["peak_flops"] > 1e8
    assert f"measured float32 matmul peak {found['peak_flops'] / 1e9:.1f} GFLOP/s" in \
        harness.describe(found)
