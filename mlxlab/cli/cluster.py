"""``--cluster [ADDRESS|local]``: a command's sweep on a Dask cluster (:mod:`mlxlab.core.cluster`).

Without the option a command runs in this process, as it always has. ``--cluster local`` (or a
bare ``--cluster``) starts worker processes on this machine; ``--cluster tcp://HOST:8786`` uses
the scheduler there. ``seed-scale`` sends its simulator points anywhere; ``bench contention``
sends one (model, setting) per point to the workers that hold an accelerator, one at a time each
(:mod:`mlxlab.studies.contention.sweep`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mlxlab.core.results import run_folder, save_results


def add_cluster_argument(parser: argparse.ArgumentParser, what: str) -> argparse.Action:
    """``--cluster [ADDRESS|local]`` on ``parser``; ``what`` says what one point is."""
    return parser.add_argument(
        "--cluster", nargs="?", const="local", default=None, metavar="ADDRESS|local",
        help=f"run {what} on a Dask cluster: 'local' (or no value) starts one worker process per CPU core "
             f"here, an address (tcp://HOST:8786) uses that scheduler, whose machines each run `dask worker "
             f"ADDRESS --nthreads 1 --resources accelerator=1` (default: in this process)")


def open_sweep(address: str, **options):
    """The :class:`~mlxlab.core.cluster.Sweep` for ``--cluster``'s value (``local``: a local cluster)."""
    from mlxlab.core.cluster import Sweep  # Dask: only when a command asks for a cluster

    sweep = Sweep(None if address == "local" else address, **options)
    print(f"[cluster] {sweep.address}: {len(sweep.workers())} workers", flush=True)
    return sweep


def seed_scale_on_cluster(args: argparse.Namespace) -> dict:
    """``seed-scale --cluster``: the study's simulator points on the cluster, saved where and as
    the in-process run saves them (``--out``, ``--save`` or a new run folder, made once the
    study is done), with the sweep's provenance (``cluster``) and its scheduler in the
    parameters."""
    from mlxlab.studies.seed_scale.run import save_study, seed_scale_study

    with open_sweep(args.cluster) as sweep:
        res = seed_scale_study(save=False, log=print, mapper=sweep.mapper(timed=False, desc="seed-scale points"))
        res["cluster"] = sweep.provenance()
    res["config"]["cluster"] = res["cluster"]["scheduler"]
    folder = args.out or (None if args.save else run_folder("sim-seed001"))  # None: the committed folders
    res["paths"] = save_study(res, "seed_scale", figure=not args.no_figure, folder=folder)
    return res


def contention_on_cluster(args: argparse.Namespace, earlier_presets, figure) -> int:
    """``bench contention --cluster``: one (model, setting) per timed point; the results file,
    verdicts and figure as the in-process command writes them, each row with the worker it ran
    on, the points appended to ``<name>_points.jsonl`` as they finish. ``earlier_presets`` and
    ``figure``: the in-process command's ``--append`` reader and figure writer
    (:mod:`mlxlab.cli.studies`, passed in so the two modules do not import each other)."""
    from mlxlab.core.results import jsonable, results_dir
    from mlxlab.studies.contention.run import format_table
    from mlxlab.studies.contention.sweep import contention_points, merge_points, run_setting
    from mlxlab.studies.contention.verdict import verdicts

    params = {k: getattr(args, k) for k in ("models", "bits", "dtype", "doc_tokens", "chat_context", "repeats",
                                            "settings", "warmup", "seed", "cluster")}
    points = contention_points(args.models, args.settings, bits=args.bits, dtype=args.dtype,
                               doc_tokens=args.doc_tokens, chat_context=args.chat_context, repeats=args.repeats,
                               warmup=args.warmup, seed=args.seed)
    with open_sweep(args.cluster, platform=args.platform) as sweep:
        plat = args.platform or sweep.accelerator_platform()  # before measuring: one folder, one kind of machine
        folder = run_folder(plat, args.save)
        log = folder / f"{args.name}_points.jsonl"
        log.write_text("")

        def append(r) -> None:
            with log.open("a") as f:
                f.write(json.dumps(jsonable({**r.record(), "value": r.value}), default=str) + "\n")
            print(f"[bench contention] {r.params['model']} {r.params['setting']} done on {r.host} "
                  f"({r.ended_at - r.started_at:.1f} s)", flush=True)

        results = sweep.run(run_setting, points, timed=True, desc="contention settings", on_result=append)
        cluster = sweep.provenance()
    earlier = Path(args.append) if args.append else results_dir(plat) / f"{args.name}.json"
    out = {"presets": earlier_presets(earlier, args.models) if args.append is not None else {}}
    out["presets"].update(merge_points(results))
    out["cluster"] = cluster
    for preset in args.models:
        print(format_table(preset, out["presets"][preset]), flush=True)
    vs = verdicts(out["presets"])
    path = save_results(args.name, out, platform=plat, folder=folder, verdicts=vs, parameters=params)
    figures = figure(out["presets"], args.name, plat, None if args.save else folder)
    for v in vs:
        print(f"[{v['verdict']}] {v['claim']}: {v['measured']}")
    print(f"wrote {path}, {log}" + "".join(f", {p}" for p in figures))
    return 0
