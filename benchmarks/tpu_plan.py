"""The TPU plan of the original recipe's configs on four slices: per-chip memory of the config's
batch, whether it fits, the largest global batch that fits, and the compile time here.

  python -m benchmarks.tpu_plan --out=/tmp/tpu_plan.jsonl
  python -m benchmarks.tpu_plan --sizes=base --phases=phase1 --slices=v5litepod-16

Each row is `python -m bertjax.main --config=configs/SIZE.py:PHASE --compile_only=SLICE
--largest_batch` done in a worker process: the train step compiled with XLA:TPU on this
machine for the slice's devices (libtpu describes them), first at the config's global batch
(256), then at the batches the search tries. Rows already in --out are kept, so an
interrupted run resumes; the table is printed from --out at the end. Needs libtpu (the test
extra; Linux x86_64).
"""

from __future__ import annotations

import concurrent.futures
import json
import math
import multiprocessing
import os
import time

from benchmarks import harness

SIZES = ("base", "large")
PHASES = ("phase1", "phase2")
SLICES = ("v4-8", "v5litepod-16", "v5p-8", "v6e-8")


def plan_row(size: str, phase: str, slice_name: str, max_compiles: int,
             precision: float) -> dict:
    import jax
    jax.config.update("jax_platforms", "cpu")
    from bertjax.training import plan as plan_lib
    from bertjax.training import pretrain_config

    config = pretrain_config.original_recipe(size, phase)
    started = time.perf_counter()
    first = plan_lib.compile_plan(config, slice_name, evaluation=False)
    hosts = first.hosts
    shards = first.mesh_shape["data"] * first.mesh_shape["fsdp"]
    granule = math.lcm(shards * config.optimizer.grad_accum_steps, hosts)
    best, misfit = first, None
    if max_compiles >= 0:
        best, misfit = plan_lib.largest_batch(config, slice_name, first, granule,
                                              max_compiles=max_compiles, precision=precision,
                                              report=lambda _: None)
    train = first.steps[0]
    return {"size": size, "phase": phase, "slice": slice_name, "topology": first.tpu.topology,
            "chips": first.tpu.chips, "hosts": hosts, "device_kind": first.device_kind,
            "hbm_gib": first.tpu.generation.hbm_gib,
            "global_batch_size": first.global_batch_size,
            "state_bytes": train.state_bytes, "temp_bytes": train.temp_bytes,
            "total_bytes": train.total_bytes, "fits": first.fits,
            "compile_seconds": train.compile_seconds, "flops_per_chip": train.flops,
            "largest_batch": best.global_batch_size if max_compiles >= 0 else None,
            "largest_batch_bytes": best.largest.total_bytes, "smallest_misfit": misfit,
            "search_seconds": time.perf_counter() - started}


def table(bench: harness.Run, rows: list[dict]) -> None:
    out = bench.table("the original recipe's configs", [
        ("config", ""), ("slice", ""), ("chips (hosts)", ""), ("per chip at batch 256", ""),
        ("fits", ""), ("largest global batch found to fit (next tried)", ""),
        ("compile s", ".0f")])
    order = {(s, p, t): i for i, (s, p, t) in enumerate(
        (s, p, t) for s in SIZES for p in PHASES for t in SLICES)}
    for r in sorted(rows, key=lambda r: order.get((r["size"], r["phase"], r["slice"]), 99)):
        gib = r["total_bytes"] / (1 << 30)
        above = f" ({r['smallest_misfit']:,})" if r["smallest_misfit"] else ""
        largest = f"{r['largest_batch']:,}{above}" if r["largest_batch"] else "not searched"
        out.row(f"{r['size']} {r['phase']}", f"{r['slice']} ({r['topology']})",
                f"{r['chips']} ({r['hosts']})", f"{gib:.2f} of {r['hbm_gib']} GiB",
                "yes" if r["fits"] else "no", largest, r["compile_seconds"])


def main() -> None:
    parser = harness.parser(__doc__)
    parser.add_argument("--sizes", default=",".join(SIZES))
    parser.add_argument("--phases", default=",".join(PHASES))
    parser.add_argument("--slices", default=",".join(SLICES))
    parser.add_argument("--workers", type=int, default=2,
                        help="rows compiled at once (XLA:TPU compiles on one core)")
    parser.add_argument("--max_compiles", type=int, default=4,
                        help="compiles the largest-batch search spends after its first two; "
                             "-1: no search, the config's batch alone")
    parser.add_argument("--precision", type=float, default=0.05,
                        help="the search stops when fit and misfit are this close")
    parser.add_argument("--out", default="tpu_plan.jsonl",
                        help="one row a line, kept: a rerun resumes")
    args = parser.parse_args()
    # No JAX here: the workers compile, each in its own process.
    bench = harness.start(args, peak=False)
    done = []
    if os.path.exists(args.out):
        with open(args.out, encoding="utf-8") as f:
            done = [json.loads(line) for line in f if line.strip()]
    have = {(r["size"], r["phase"], r["slice"]) for r in done}
    todo = [(s, p, t) for s in args.sizes.split(",") for p in args.phases.split(",")
            for t in args.slices.split(",") if (s, p, t) not in have]
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(args.workers, mp_context=context) as pool:
        futures = {pool.submit(plan_row, *row, args.max_compiles, args.precision): row
                   for row in todo}
        for future in concurrent.futures.as_completed(futures):
            row = future.result()
            done.append(row)
            with open(args.out, "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
            print(f"{' '.join(futures[future])}: {row['total_bytes'] / (1 << 30):.2f} GiB per "
                  f"chip at batch {row['global_batch_size']}, largest found "
                  f"{row['largest_batch']} ({row['search_seconds']:.0f} s)", flush=True)
    table(bench, done)
    bench.figure("rows", done)
    bench.finish()


if __name__ == "__main__":
    main()
