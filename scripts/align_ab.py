#!/usr/bin/env python3
"""Aligned chunks A/B: the same contention workloads on the engine with ``key_align=8`` (the
default: final chunks padded, ``stall_free``/``slo`` chunks ending on a multiple of 8) and with
``key_align=1`` (chunks as the policy's budget gives them), alternating, in one process.

Usage::

    python scripts/align_ab.py --model small --scale 0.25 --repeats 2    # CPU smoke run
    bash scripts/h200_batch.sh align                                     # the H200 run

Writes ``data/results/<platform>/align_ab.json``: per workload, policy and setting, each run's
TTFT p50 and ITL p50/p99 per tenant, their medians, and the ratios unaligned / aligned.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mlxlab.cli.common import add_model_arguments  # noqa: E402
from mlxlab.core.environment import reexec_with_fast_blas  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_arguments(p)
    p.add_argument("--scale", type=float, default=8.0, help="validation_workloads scale")
    p.add_argument("--policies", default="stall_free,interleave")
    p.add_argument("--chunk-size", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--name", default="align_ab")
    args = p.parse_args(argv)
    reexec_with_fast_blas()
    import mlx.core as mx

    from mlxlab import load_model
    from mlxlab.engine.loop import Engine
    from mlxlab.core.environment import mlx_env
    from mlxlab.core.results import save_results
    from mlxlab.core.runner import run_workload
    from mlxlab.studies.sim_validation import validation_workloads

    model = load_model(args.model, bits=args.bits, dtype=args.dtype)
    workloads = validation_workloads(model, scale=args.scale)
    policies = args.policies.split(",")
    t_start = time.perf_counter()

    def once(wl, policy, align):
        mx.clear_cache()
        res = run_workload(Engine(model, policy=policy, chunk_size=args.chunk_size, key_align=align), wl)
        return {t: {"ttft_p50_s": v["ttft_s"]["p50"], "itl_p50_s": v["itl_s"]["p50"], "itl_p99_s": v["itl_s"]["p99"]}
                for t, v in res.summary.items() if t != "all"}

    rows = []
    for wname, wl in workloads.items():
        for policy in policies:
            once(wl, policy, 8), once(wl, policy, 1)  # first use of every shape
            runs = {8: [], 1: []}
            for r in range(args.repeats):
                for align in ((8, 1) if r % 2 == 0 else (1, 8)):
                    runs[align].append(once(wl, policy, align))
            for tenant in runs[8][0]:
                for metric in ("ttft_p50_s", "itl_p50_s", "itl_p99_s"):
                    a = statistics.median(x[tenant][metric] for x in runs[8])
                    u = statistics.median(x[tenant][metric] for x in runs[1])
                    rows.append({"workload": wname, "policy": policy, "tenant": tenant, "metric": metric,
                                 "aligned": a, "unaligned": u, "unaligned_over_aligned": u / a if a else None,
                                 "aligned_runs": [x[tenant][metric] for x in runs[8]],
                                 "unaligned_runs": [x[tenant][metric] for x in runs[1]]})
                    print(f"[align] {wname:10s} {policy:14s} {tenant:6s} {metric:11s} aligned {a * 1e3:8.1f} ms "
                          f"unaligned {u * 1e3:8.1f} ms  x{u / a if a else float('nan'):.2f}", flush=True)
    path = save_results(args.name, {"kind": "align_ab", "model": args.model, "bits": args.bits,
                                    "dtype": str(model.dtype), "scale": args.scale, "chunk_size": args.chunk_size,
                                    "repeats": args.repeats, "mlx_env": mlx_env()[0], "rows": rows,
                                    "wall_s": time.perf_counter() - t_start})
    print(f"[align] wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
