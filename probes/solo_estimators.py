"""Which solo figure moves least between tunes: the median of k runs' tails, or the tail of their gaps pooled?

A relative SLO's bound (``chat.itl_p99<=3x``) is that many times the tenant's figure alone on the engine;
``mlxlab tune`` takes the median over its solo runs of each run's figure. Stored tunes of one model, trace
and device found bounds 1.45-2.2x apart (``probes/solo_spread.py``). A p99 over one run's ~100-1,000
gaps is a few gaps from the largest; pooling k runs' gaps puts k times as many under the same percentile.

This probe runs ``--tenant`` alone ``--runs`` times in one process on tune's solo setting
(:data:`mlxlab.studies.tune.calibrate.REF`), as tune does, and keeps every run's requests. Then, over
``--draws`` random sets of k runs (k in ``--k``; the first run, the process's first, left out and
reported apart), it compares the two estimators of ``--metric``: the median of the k runs' figures
and the figure over their requests pooled. Per estimator: the draws' median, their 10th-90th
percentile range over the median (``spread``) and largest over smallest (``range_x``).

Usage::

    python -m probes.solo_estimators [--trace seed001_scene_tiny.jsonl] [--length-scale 0.5]
        [--output-scale chat=8] [--runs 12] [--save]

Writes ``--name`` (``solo_estimators``) ``.json`` to a new run folder, or with ``--save`` to the platform's
committed results.
"""

from __future__ import annotations

import random
import statistics
import sys
import time

from probes import common


def parse_args(argv=None):
    from mlxlab.cli.tune import tenant_factor

    p = common.parser(__doc__, "solo_estimators")
    p.add_argument("--trace", default="seed001_scene_tiny.jsonl", help="a trace file or a committed sample's name")
    p.add_argument("--length-scale", type=float, default=0.5, help="as tune's --length-scale")
    p.add_argument("--output-scale", type=tenant_factor, action="append", default=None, metavar="TENANT=F",
                   help="as tune's --output-scale, e.g. chat=8")
    p.add_argument("--tenant", default="chat")
    p.add_argument("--metric", default="itl_p99", help="tune's SLO metric names (itl_p99, ttft_p50, ...)")
    p.add_argument("--runs", type=int, default=12, help="solo runs in this process (the first is kept apart)")
    p.add_argument("--k", type=int, nargs="+", default=[2, 3, 5], help="runs per estimate (tune's --repeats)")
    p.add_argument("--draws", type=int, default=400, help="random sets of k runs per k")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save", action="store_true", help="write to the platform's committed results")
    return common.parse(p, argv)


def estimates(per_run: list, pooled_of, k: int, draws: int, seed: int = 0) -> dict:
    """Over ``draws`` random sets of ``k`` of the runs (indices into ``per_run``, each run's figure):
    ``median`` (the median of the set's figures, tune's solo figure) and ``pooled`` (``pooled_of(indices)``:
    the figure over the set's requests together), each as the draws' median, ``spread`` ((p90 - p10) / median)
    and ``range_x`` (largest / smallest)."""
    rng = random.Random(seed)
    n = len(per_run)
    if k > n:
        raise ValueError(f"k={k} is more than the {n} runs")
    med, pool = [], []
    for _ in range(draws):
        idx = rng.sample(range(n), k)
        med.append(statistics.median(per_run[i] for i in idx))
        pool.append(pooled_of(idx))

    def stats(v):
        q = statistics.quantiles(v, n=10)
        m = statistics.median(v)
        return {"median": m, "spread": (q[-1] - q[0]) / m, "range_x": max(v) / min(v)}

    return {"k": k, "median": stats(med), "pooled": stats(pool)}


def main(argv=None) -> int:
    args = parse_args(argv)
    from mlxlab.core.results import run_folder, save_results
    from mlxlab.core.metrics import tenant_summaries
    from mlxlab.core.presets import model_limits
    from mlxlab.core.runner import run_workload
    from mlxlab.core.traces import find_trace, prepare_trace, to_arrivals
    from mlxlab.studies.tune.calibrate import REF
    from mlxlab.studies.tune.run import _engine, _fresh, _workload
    from mlxlab.studies.tune.slo import figure

    model = common.load(args)
    vocab, _ = model_limits(model)
    trace = prepare_trace(find_trace(args.trace), "auto", length_scale=args.length_scale,
                          output_scale=dict(args.output_scale) if args.output_scale else None)
    arrivals = [a for a in to_arrivals(trace, vocab, 0) if a.tenant == args.tenant]
    if not arrivals:
        raise SystemExit(f"the trace has no tenant {args.tenant!r}")
    runs, walls = [], []
    for i in range(args.runs):
        _fresh()
        t0 = time.perf_counter()
        res = run_workload(_engine(model, REF), _workload(arrivals, args.tenant))
        walls.append(time.perf_counter() - t0)
        runs.append(list(res.submitted))
        v = figure(res.summary, args.tenant, args.metric)
        common.log("solo_estimators", f"run {i + 1}/{args.runs}: {args.metric} {v * 1e3:.2f} ms ({walls[-1]:.1f} s)")

    def fig(reqs):
        return figure(tenant_summaries(reqs), args.tenant, args.metric)

    per_run = [fig(r) for r in runs]
    later = runs[1:]
    later_figs = per_run[1:]
    samples = [len([g for r in rs if r.tenant == args.tenant for g in range(max(len(r.token_times_s) - 1, 0))])
               for rs in runs]
    params = {k: getattr(args, k) for k in ("trace", "length_scale", "tenant", "metric", "runs", "k", "draws", "seed")}
    out = {"kind": "solo_estimators", "parameters": {**params, "output_scale": dict(args.output_scale or [])},
           "setting": REF, "per_run_s": per_run, "wall_s": walls, "gaps_per_run": samples[0] if samples else None,
           "first_over_later_median": per_run[0] / statistics.median(later_figs),
           "estimators": [estimates(later_figs, lambda idx: fig([q for i in idx for q in later[i]]), k, args.draws,
                                    args.seed) for k in args.k if k <= len(later)]}
    for e in out["estimators"]:
        common.log("solo_estimators", f"k={e['k']}: median of runs spread {e['median']['spread']:.3f} "
                                      f"(range {e['median']['range_x']:.2f}x), pooled spread {e['pooled']['spread']:.3f} "
                                      f"(range {e['pooled']['range_x']:.2f}x)")
    out.update(mlx_env=common.mlx_env()[0], wall_total_s=time.perf_counter() - args.started)
    path = save_results(args.name, out, platform=args.platform, folder=None if args.save else run_folder(args.platform))
    common.log("solo_estimators", f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
