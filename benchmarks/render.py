"""A benchmark's record (its --json file) as markdown: the command, the machine, and every
table as the run printed it, for docs/results.md.

  python -m benchmarks.render /tmp/train_step.json [MORE.json ...]
"""

from __future__ import annotations

import argparse
import json

from benchmarks import harness


def render(record: dict) -> str:
    parts = [f"Command: `{record['command']}`", "",
             f"Machine: {harness.describe(record['machine'])}"]
    parts += ["\n" + harness.markdown(table) for table in record["tables"]]
    return "\n".join(parts) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.render",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("records", nargs="+", metavar="FILE", help="a benchmark's --json file")
    for path in p.parse_args().records:
        with open(path, encoding="utf-8") as f:
            try:
                record = json.load(f)
            except json.JSONDecodeError as e:
                p.error(f"{path}: not a benchmark record ({e})")
        missing = {"command", "machine", "tables"} - set(record)
        if missing:
            p.error(f"{path}: not a benchmark record (no {', '.join(sorted(missing))})")
        print(render(record))


if __name__ == "__main__":
    main()
