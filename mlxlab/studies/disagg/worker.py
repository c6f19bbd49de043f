"""One process of a disaggregation run (``python -m mlxlab.studies.disagg.worker``): under
``mlx.launch`` (``MLX_RANK`` set) rank 0 is the prefill worker and rank 1 the decode worker
(:mod:`mlxlab.engine.disagg`); with ``--local`` the whole workload runs on one engine in this
process, the baseline. Each runs the workload ``--rounds`` times on fresh engines (round 1 meets
every shape first; later rounds are warm) and writes ``<out>/rank<r>.json`` or ``<out>/local.json``:
per round each request's tokens and times, step records, and on the ranks what was sent and
received. :mod:`mlxlab.studies.disagg.run` launches these and reads the files.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def _request(req) -> dict:
    return {"prompt_tokens": req.prompt_tokens, "max_tokens": req.max_tokens, "tenant": req.tenant,
            "arrival_s": req.arrival_s, "prefill_start_s": req.prefill_start_s, "output_tokens": req.output_tokens,
            "token_times_s": req.token_times_s, "finish_s": req.finish_s, "finish_reason": req.finish_reason}


def _steps(engine) -> list:
    return [s.as_dict() for s in engine.steps]


def _threads() -> dict:
    return {k: os.environ.get(k) for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MLX_RANK", "LD_PRELOAD")}


def _normal_priority() -> str:
    """Back to ``SCHED_OTHER`` if this process inherited ``SCHED_IDLE`` from its launcher (see
    :func:`mlxlab.studies.disagg.run._idle_launcher`); returns the policy it started with."""
    if not hasattr(os, "sched_getscheduler"):
        return "unknown"
    if os.sched_getscheduler(0) == os.SCHED_IDLE:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        return "idle (reset to other)"
    return "other"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m mlxlab.studies.disagg.worker", description=__doc__)
    p.add_argument("--workload", required=True, help="JSON file: a list of requests (mlxlab.engine.disagg)")
    p.add_argument("--out", required=True, help="folder for rank<r>.json / local.json")
    p.add_argument("--model", default="tiny")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--policy", default="interleave", help="the prefill worker's (or the local engine's) policy")
    p.add_argument("--chunk-size", type=int, default=512)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--local", action="store_true", help="run the workload on one engine in this process")
    p.add_argument("--busy-wait", action="store_true",
                   help="leave mlx's ring threads busy-polling at full priority while they wait (Comms)")
    args = p.parse_args(argv)
    policy = _normal_priority()

    from mlxlab.engine import disagg
    from mlxlab.engine.models import load_model

    workload = disagg.check_workload(json.loads(Path(args.workload).read_text()))
    model = load_model(args.model, dtype=args.dtype)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rounds, t_load, t_init = [], time.perf_counter(), None
    if args.local:
        name = "local"
        for _ in range(args.rounds):
            eng = disagg.Engine(model, policy=args.policy, chunk_size=args.chunk_size)
            c0 = time.process_time()
            reqs = disagg.run_local(eng, workload)
            rounds.append({"requests": {i: _request(r) for i, r in reqs.items()}, "steps": _steps(eng),
                           "cpu_s": time.process_time() - c0})
    else:
        comms = disagg.Comms("ring", idle_wait=not args.busy_wait)
        t_init = time.perf_counter() - t_load
        if comms.group.size() != 2:
            raise SystemExit(f"disaggregation runs on exactly 2 ranks (prefill, decode), got {comms.group.size()}")
        rank = comms.group.rank()
        name = f"rank{rank}"
        for _ in range(args.rounds):
            t_round, c0 = time.perf_counter(), time.process_time()
            if rank == disagg.PREFILL_RANK:
                res = disagg.run_prefill(lambda hand_off: disagg.PrefillEngine(
                    model, hand_off, policy=args.policy, chunk_size=args.chunk_size), workload, comms)
                rounds.append({"requests": {i: _request(r) for i, r in res["requests"].items()},
                               "sent": res["sent"], "steps": _steps(res["engine"])})
            else:
                res = disagg.run_decode(disagg.DecodeEngine(model, policy="interleave"), workload, comms)
                rounds.append({"requests": {i: _request(r) for i, r in res["requests"].items()},
                               "received": res["received"], "steps": _steps(res["engine"])})
            rounds[-1]["round_s"] = time.perf_counter() - t_round
            rounds[-1]["cpu_s"] = time.process_time() - c0  # every thread's, the ring's too
    from mlxlab.core.environment import blas_in_use

    doc = {"role": name, "blas": blas_in_use(), "model": args.model, "dtype": args.dtype, "policy": args.policy,
           "chunk_size": args.chunk_size, "env": _threads(), "seconds": time.perf_counter() - t_load, "init_s": t_init,
           "ring_threads_idle_wait": None if args.local else comms.idle_wait,
           "started_scheduling": policy,
           "ring_wait_duty_cycle_s": None if args.local or not comms.idle_wait else [comms.awake_s, comms.period_s],
           "rounds": rounds}
    (out / f"{name}.json").write_text(json.dumps(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
