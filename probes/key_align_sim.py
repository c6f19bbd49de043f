"""Key-alignment simulation: a stored tune's ``stall_free`` settings again, on its own fitted cost
model, with their chunks ending on key lengths that are multiples of ``--key-aligns``.

On mlx's CUDA backend with cuDNN attention on, the first use of an attention shape costs ~66 ms
(``probes/shape_probe.py``, ``data/results/h100/shape_probe_*.json``). ``stall_free``'s chunk is its
token budget less its decode rows, so its key length lands somewhere new nearly every step; with a
coarser ``key_align`` the chunks end on a few key lengths and the shapes repeat prompt after prompt.
This asks the simulator, on the cost model a tune on that device fitted (``profile.cost_model`` in
its ``tune.json``, cold chunks counted by shape), how much each alignment gives back, and it needs no
device: the trace, the SLOs and the solo figures are the stored run's. The grid's own settings are
simulated too, to check they come out as stored (the simulator is deterministic).

Usage::

    python -m probes.key_align_sim data/results/h100/tune_qwen2.5-coder-1.5b.json
    python -m probes.key_align_sim FILE --policy stall_free --key-aligns 8 64 128 256 512

Prints a table and writes ``key_align_sim_<model>.json`` to a new run folder
(``data/results/<platform>/runs/<time>/``, ignored by git).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import List

from probes import common


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m probes.key_align_sim", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("tune", help="a tune.json with profile.cost_model (mlxlab tune since 2026-12-06)")
    p.add_argument("--policy", default="stall_free", help="the grid's settings of this policy are varied")
    p.add_argument("--key-aligns", type=int, nargs="+", default=[8, 32, 64, 128, 256, 512])
    p.add_argument("--traces", default="data/traces/samples", help="the folder holding the tune's trace file")
    args = common.parse(p, argv)
    if any(k < 1 for k in args.key_aligns):
        p.error("--key-aligns must be >= 1")
    return args


def load_point(doc: dict, traces: str) -> dict:
    """The simulation point tune built for ``doc``'s run (without its setting): the cost model, the
    model's limits, the trace's arrivals, the SLOs, solo figures, objective and tenants."""
    from mlxlab.core.costmodel import StepCostModel
    from mlxlab.core.presets import model_limits, preset_config
    from mlxlab.core.traces import prepare_trace, to_arrivals
    from mlxlab.studies.tune.slo import parse_slo

    p = doc["parameters"]
    # the model the grid was simulated on: calibrated on the solo run where tune did so, else the fitted one
    cm = (doc.get("calibration") or {}).get("cost_model") or (doc.get("profile") or {}).get("cost_model")
    if not cm:
        raise ValueError("this tune file keeps no fitted cost model (profile.cost_model): re-run mlxlab tune")
    if not p.get("trace"):
        raise ValueError("this tune ran a --workload preset, not a trace file: only traces are replayed here")
    vocab, ctx = model_limits(preset_config(p["model"]))
    trace = prepare_trace(Path(traces) / p["trace"], p.get("trace_format") or "auto",
                          split_tokens=p.get("split_tokens"), time_scale=p.get("time_scale", 1.0),
                          length_scale=p.get("length_scale", 1.0), output_scale=p.get("output_scale"),
                          max_requests=p.get("max_requests"))
    return {"cost_model": StepCostModel.from_dict(cm), "limits": {"vocab_size": vocab, "max_context": ctx},
            "arrivals": to_arrivals(trace, vocab, p.get("seed") or 0), "slos": [parse_slo(s) for s in doc["slos"]],
            "solos": doc["solo"], "objective": doc["objective"], "tenants": doc["tenants"]}


def rows(doc: dict, point: dict, policy: str, key_aligns: List[int]) -> List[dict]:
    """Per setting of ``policy`` in the grid, per alignment: the simulated objective, worst SLO
    ratio and the chat's ITL p50/p99 (where the trace has a chat), beside the stored simulation."""
    from mlxlab.studies.tune.run import simulate_setting

    out = []
    for g in (g for g in doc["grid"] if g["policy"] == policy):
        for ka in [None] + list(key_aligns):
            opts = dict(g["options"]) if ka is None else {**g["options"], "key_align": ka}
            s = {"label": g["label"], "policy": g["policy"], "chunk_size": g["chunk_size"], "options": opts}
            r = simulate_setting({**point, "setting": s})
            chat = r["summary"].get("chat", {}).get("itl_s", {})
            out.append({"label": g["label"], "key_align": opts.get("key_align", "default") if ka is None else ka,
                        "as_stored": ka is None, "objective_s": r["objective_s"], "slo_ratio": r["slo_ratio"],
                        "chat_itl_p50_s": chat.get("p50"), "chat_itl_p99_s": chat.get("p99"),
                        "stored_objective_s": g["objective_s"] if ka is None else None})
    return out


def main(argv=None) -> int:
    from mlxlab.core.results import run_folder, save_results

    args = parse_args(argv)
    doc = json.loads(Path(args.tune).read_text())
    out = rows(doc, load_point(doc, args.traces), args.policy, args.key_aligns)
    if not out:
        raise SystemExit(f"{args.tune}: its grid has no {args.policy} setting")
    ms = lambda v: f"{v * 1e3:9.1f}" if v is not None else "      n/a"  # noqa: E731
    print(f"{'setting':18s} {'key_align':>9s} {'objective ms':>12s} {'SLO ratio':>9s} {'chat ITL p50':>12s} {'p99':>9s}")
    for r in out:
        print(f"{r['label']:18s} {str(r['key_align']) + ('*' if r['as_stored'] else ''):>9s} {ms(r['objective_s']):>12s} "
              f"{r['slo_ratio']:9.2f} {ms(r['chat_itl_p50_s']):>12s} {ms(r['chat_itl_p99_s'])}")
    print("* the grid's setting as stored (its objective then equals the stored simulation's: "
          + ", ".join(f"{r['label']} {abs(r['objective_s'] - r['stored_objective_s']) < 1e-9}" for r in out
                      if r["as_stored"]) + ")")
    plat = (doc.get("environment") or {}).get("platform") or Path(args.tune).parent.name
    path = save_results(f"key_align_sim_{doc['parameters']['model']}", {
        "kind": "key_align_sim", "tune": Path(args.tune).name, "platform_of_tune": plat, "policy": args.policy,
        "cost_model": doc["profile"]["cost_model"], "rows": out}, platform=plat, folder=run_folder(plat))
    common.log("key_align_sim", f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
