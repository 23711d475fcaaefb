"""What every benchmark shares: its flags, the machine it ran on, timing, and the record of its
figures.

A script builds its flags with `parser(__doc__)` (which adds --json), calls `start(args)` once
its process is set up (before any timing: it measures the machine's matmul peak), prints each
table through `Run.table` and ends with `Run.finish()`. The record, written to --json, holds
the exact command, the machine and every table's figures unformatted;
`python -m benchmarks.render FILE` prints its tables again, as the run printed them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import sys
import time

# A matmul this large runs near the peak of one CPU core or accelerator; bf16 needs a larger
# one to fill a GPU's matrix units.
PEAK_SIZES = {"float32": 2048, "bfloat16": 4096}


def parser(doc: str) -> argparse.ArgumentParser:
    """The script's flags: its docstring's first paragraph as the description, the rest
    (the commands, what is measured) after the flags in --help, and --json."""
    summary, _, rest = doc.strip().partition("\n\n")
    p = argparse.ArgumentParser(prog=" ".join(_invocation()), description=summary, epilog=rest,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", metavar="PATH",
                   help="write the command, the machine and every figure to PATH "
                   "(python -m benchmarks.render PATH prints the tables again)")
    return p


def step_flags(p: argparse.ArgumentParser) -> None:
    """The shape of a synthetic pretraining step: model preset, batch, lengths, vocabulary."""
    p.add_argument("--size", default="mini", help="a preset of bertjax/models/presets.py")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq_len", type=int, default=128)
    p.add_argument("--predictions", type=int, default=20, help="masked positions per row")
    p.add_argument("--vocab", type=int, default=30522)


# --- the machine --------------------------------------------------------------------------------


def cpu() -> dict:
    """The CPU's name with its family and model numbers (some hosts name only the brand), the
    instruction sets XLA's CPU code depends on, and the cores this process may use."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or platform.machine()
    if "cpu family" in fields:
        name += f" (family {fields['cpu family']} model {fields.get('model', '?')})"
    wanted = {"avx2", "avx512f", "avx512_bf16", "amx_tile"}
    return {"name": name, "isa": sorted(set(fields.get("flags", "").split()) & wanted),
            "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else os.cpu_count()}


def machine(peak: bool = True, dtype: str = "float32") -> dict:
    """Where the figures were measured, now: the CPU, the load, and unless `peak` is False
    the accelerator JAX sees and its `dtype` matmul FLOP/s measured in this process (figures
    compare only within one run: the machine may be shared)."""
    found = {"cpu": cpu(), "load_average": os.getloadavg()[0], "python": platform.python_version()}
    if peak:
        import jax

        from bertjax.training import metrics
        device = jax.devices()[0]
        found.update(
            accelerator=f"{len(jax.devices())} x {device.device_kind}",
            platform=device.platform, jax=jax.__version__, peak_dtype=dtype,
            peak_flops=metrics.measure_matmul_flops(size=PEAK_SIZES[dtype], repeats=5,
                                                    dtype=jax.numpy.dtype(dtype)))
    return found


def describe(m: dict) -> str:
    """The machine as one line."""
    c = m["cpu"]
    line = f"{c['name']} [{' '.join(c['isa'])}], {c['cores']} cores"
    if "accelerator" in m:
        line += f"; {m['accelerator']} ({m['platform']}, jax {m['jax']})"
    line += f"; load average {m['load_average']:.2f} (1 min) at start"
    if "peak_flops" in m:
        line += f"; measured {m['peak_dtype']} matmul peak {m['peak_flops'] / 1e9:.1f} GFLOP/s"
    return line


def _invocation() -> list[str]:
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    return (["python", "-m", spec.name] if spec is not None and spec.name
            else ["python", os.path.relpath(sys.argv[0])])


def command() -> str:
    """The command line that ran this process, as it reruns from the repository root (with
    XLA_FLAGS, which change what XLA compiles, when they are set)."""
    env = [f"XLA_FLAGS={shlex.quote(os.environ['XLA_FLAGS'])}"] if "XLA_FLAGS" in os.environ \
        else []
    return " ".join(env + [shlex.join(_invocation() + sys.argv[1:])])


# --- timing -------------------------------------------------------------------------------------


def time_in_turns(steps_by_name: dict, warmup: int, steps: int, repeats: int) -> dict:
    """Best seconds per call of each; a call must block until its work is done. Repeats
    take turns, so a burst of load from other work hits every contestant alike."""
    for step in steps_by_name.values():
        for _ in range(warmup):
            step()
    best = {name: float("inf") for name in steps_by_name}
    for _ in range(repeats):
        for name, step in steps_by_name.items():
            start = time.perf_counter()
            for _ in range(steps):
                step()
            best[name] = min(best[name], (time.perf_counter() - start) / steps)
    return best


def best_seconds(fn, repeats: int) -> float:
    """The fastest of `repeats` calls of `fn`, after one untimed call (compilation)."""
    return time_in_turns({"fn": fn}, warmup=1, steps=1, repeats=repeats)["fn"]


# --- the record ---------------------------------------------------------------------------------


def cell(value, spec: str) -> str:
    """A figure as its table shows it: numbers by their format spec, text as it is."""
    if value is None:
        return ""
    if spec and isinstance(value, (int, float)) and not isinstance(value, bool):
        return format(value, spec)
    return str(value)


def markdown(table: dict) -> str:
    """A recorded table as markdown: its title line, then the table (numbers right-aligned)."""
    specs = [spec for _, spec in table["columns"]]
    lines = [table["title"], ""] if table["title"] else []
    lines.append("| " + " | ".join(name for name, _ in table["columns"]) + " |")
    lines.append("|" + "|".join("---:" if spec else "---" for spec in specs) + "|")
    lines += ["| " + " | ".join(cell(v, s) for v, s in zip(row, specs, strict=True)) + " |"
              for row in table["rows"]]
    return "\n".join(lines)


def _plain(value):
    """NumPy scalars and arrays as JSON holds them."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"a figure JSON cannot hold: {value!r}")


class Table:
    """A table printed row by row as it is measured, and kept whole in the record. Columns
    are (name, format spec); a spec ('.1f', ',.0f', 'd') marks a number column."""

    def __init__(self, title: str, columns: list[tuple[str, str]]):
        self.data = {"title": title, "columns": [list(c) for c in columns], "rows": []}
        print("\n" + markdown(self.data), flush=True)

    def row(self, *values) -> None:
        if len(values) != len(self.data["columns"]):
            raise ValueError(f"{len(values)} values for the {len(self.data['columns'])} "
                             f"columns of table {self.data['title']!r}")
        values = tuple(v.item() if hasattr(v, "item") else v for v in values)  # NumPy scalars
        self.data["rows"].append(list(values))
        specs = [spec for _, spec in self.data["columns"]]
        print("| " + " | ".join(cell(v, s) for v, s in zip(values, specs, strict=True)) + " |",
              flush=True)


class Run:
    """One run of a benchmark: its command, machine, tables and other figures."""

    def __init__(self, args: argparse.Namespace, found: dict):
        self.json = args.json
        self.command = command()
        self.machine = found
        self.started = time.perf_counter()
        self.tables: list[Table] = []
        self.figures: dict = {}
        print(f"command: {self.command}\nmachine: {describe(found)}", flush=True)

    @property
    def peak_flops(self) -> float:
        return self.machine["peak_flops"]

    def table(self, title: str, columns: list[tuple[str, str]]) -> Table:
        self.tables.append(Table(title, columns))
        return self.tables[-1]

    def figure(self, name: str, value) -> None:
        """A figure that is not in a table (JSON-serialisable)."""
        self.figures[name] = value

    def finish(self) -> dict:
        """Prints the load at the end and writes the record to --json; the record."""
        load = os.getloadavg()[0]
        print(f"load average {load:.2f} (1 min) at the end", flush=True)
        record = {"command": self.command, "machine": self.machine,
                  "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(
                      timespec="seconds"),
                  "seconds": time.perf_counter() - self.started, "load_average_at_end": load,
                  "tables": [t.data for t in self.tables], "figures": self.figures}
        if self.json:
            directory = os.path.dirname(os.path.abspath(self.json))
            os.makedirs(directory, exist_ok=True)
            with open(self.json + ".tmp", "w", encoding="utf-8") as f:
                json.dump(record, f, indent=1, default=_plain)
            os.replace(self.json + ".tmp", self.json)
            print(f"figures: {self.json}", flush=True)
        return record


def start(args: argparse.Namespace, peak: bool = True, dtype: str = "float32") -> Run:
    """The run, its command and machine printed; see `machine` for `peak` and `dtype`."""
    return Run(args, machine(peak, dtype))
