"""Aligned chunks A/B: the same contention workloads on the engine with ``key_align=8`` (the
default: final chunks padded, ``stall_free``/``slo`` chunks ending on a multiple of 8) and with
``key_align=1`` (chunks as the policy's budget gives them), alternating, in one process.

Usage::

    python -m probes.align_ab --model small --scale 0.25 --repeats 2   # CPU smoke run
    bash scripts/h200_batch.sh align                                   # the H200 run

Writes ``data/results/<platform>/align_ab.json``: per workload, policy and setting, each run's
TTFT p50 and ITL p50/p99 per tenant, their medians, and the ratios unaligned / aligned.
"""

from __future__ import annotations

import statistics
import sys

import mlx.core as mx

from mlxlab.core.runner import run_workload
from mlxlab.engine.loop import Engine
from mlxlab.studies.sim_validation.run import validation_workloads
from probes import common

METRICS = ("ttft_p50_s", "itl_p50_s", "itl_p99_s")


def parse_args(argv=None):
    p = common.parser(__doc__, "align_ab")
    p.add_argument("--scale", type=float, default=8.0, help="validation_workloads scale")
    p.add_argument("--policies", default="stall_free,interleave")
    p.add_argument("--chunk-size", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=3)
    return common.parse(p, argv)


def once(model, wl, policy: str, align: int, chunk_size: int) -> dict:
    """Tenant -> TTFT p50, ITL p50 and p99 of one engine run of ``wl``."""
    mx.clear_cache()
    res = run_workload(Engine(model, policy=policy, chunk_size=chunk_size, key_align=align), wl)
    return {t: {"ttft_p50_s": v["ttft_s"]["p50"], "itl_p50_s": v["itl_s"]["p50"], "itl_p99_s": v["itl_s"]["p99"]}
            for t, v in res.summary.items() if t != "all"}


def alternating(model, wl, policy: str, args) -> dict:
    """key_align (8 or 1) -> one summary per repeat, the two settings taking turns going first."""
    for align in (8, 1):  # first use of every shape
        once(model, wl, policy, align, args.chunk_size)
    runs = {8: [], 1: []}
    for r in range(args.repeats):
        for align in ((8, 1) if r % 2 == 0 else (1, 8)):
            runs[align].append(once(model, wl, policy, align, args.chunk_size))
    return runs


def compare(wname: str, policy: str, runs: dict) -> list:
    """One row per tenant and metric: the medians aligned and not, their ratio, every run."""
    rows = []
    for tenant in runs[8][0]:
        for metric in METRICS:
            a = statistics.median(x[tenant][metric] for x in runs[8])
            u = statistics.median(x[tenant][metric] for x in runs[1])
            rows.append({"workload": wname, "policy": policy, "tenant": tenant, "metric": metric,
                         "aligned": a, "unaligned": u, "unaligned_over_aligned": u / a if a else None,
                         "aligned_runs": [x[tenant][metric] for x in runs[8]],
                         "unaligned_runs": [x[tenant][metric] for x in runs[1]]})
            common.log("align", f"{wname:10s} {policy:14s} {tenant:6s} {metric:11s} aligned {a * 1e3:8.1f} ms "
                                f"unaligned {u * 1e3:8.1f} ms  x{u / a if a else float('nan'):.2f}")
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    model = common.load(args)
    rows = []
    for wname, wl in validation_workloads(model, scale=args.scale).items():
        for policy in args.policies.split(","):
            rows += compare(wname, policy, alternating(model, wl, policy, args))
    common.save(args, "align_ab", {"model": args.model, "bits": args.bits, "dtype": str(model.dtype),
                                   "scale": args.scale, "chunk_size": args.chunk_size, "repeats": args.repeats,
                                   "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
