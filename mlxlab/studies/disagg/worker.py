"""One process of a disaggregation run (``python -m mlxlab.studies.disagg.worker``): under
``mlx.launch`` (``MLX_RANK`` set) rank 0 is the prefill worker and rank 1 the decode worker
(:mod:`mlxlab.engine.disagg`); with ``--local`` the whole workload runs on one engine in this
process, the baseline; with ``--split-tenant T`` only tenant T's requests run here and the others'
in a second such process (two independent engines, no KV moves: the baseline with the same
devices), the two meeting only through signal files (:func:`run_split`). ``--device N`` (or
``--device-by-rank``) pins the process to one GPU before MLX loads (``CUDA_VISIBLE_DEVICES``). Each runs the workload ``--rounds`` times on fresh engines (round 1 meets
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
    return {k: os.environ.get(k) for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MLX_RANK", "LD_PRELOAD",
                                           "CUDA_VISIBLE_DEVICES")}


def _normal_priority() -> str:
    """Back to ``SCHED_OTHER`` if this process inherited ``SCHED_IDLE`` from its launcher (see
    :func:`mlxlab.studies.disagg.run._idle_launcher`); returns the policy it started with."""
    if not hasattr(os, "sched_getscheduler"):
        return "unknown"
    if os.sched_getscheduler(0) == os.SCHED_IDLE:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        return "idle (reset to other)"
    return "other"


def run_split(engine, workload: list, tenant: str, signals: Path) -> dict:
    """Tenant ``tenant``'s requests of ``workload`` on ``engine``, the other tenants' on another
    process's engine. A trigger that crosses the two (``after``: submit once the other's request
    has N tokens; ``until``: cancel N tokens after the other's request is done) goes through files
    in ``signals``: ``tokens-I-N`` once request I has N tokens, ``done-I`` holding the absolute
    clock time (``time.perf_counter``, one clock for the host's processes) of I's first token once
    it is done. Returns index -> request, times on this engine's clock (its start in ``engine._t0``)."""
    from mlxlab.engine.disagg import check_workload

    workload = check_workload(workload)
    mine = {i for i, r in enumerate(workload) if r["tenant"] == tenant}
    if not mine:
        raise ValueError(f"no request of tenant {tenant!r} in the workload")
    wanted = {(r["after"][0], r["after"][1]) for j, r in enumerate(workload)
              if r["after"] and j not in mine and r["after"][0] in mine}
    pending, reqs, said = sorted(mine), {}, set()

    def signal() -> None:
        for src, n in wanted - said:
            if src in reqs and len(reqs[src].output_tokens) >= n:
                (signals / f"tokens-{src}-{n}").touch()
                said.add((src, n))
        for i, req in reqs.items():
            if req.done and req.token_times_s and ("done", i) not in said:
                tmp = signals / f".done-{i}"  # written whole, then renamed: the reader never sees half
                tmp.write_text(repr(engine._t0 + req.token_times_s[0]))
                tmp.replace(signals / f"done-{i}")
                said.add(("done", i))

    with engine:
        while pending or engine.has_work:
            for i in list(pending):
                r, src = workload[i], workload[i]["after"]
                if src is None:
                    ready = r["arrival_s"] <= engine.now()
                elif src[0] in mine:
                    ready = src[0] in reqs and len(reqs[src[0]].output_tokens) >= src[1]
                else:
                    ready = (signals / f"tokens-{src[0]}-{src[1]}").exists()
                if ready:
                    reqs[i] = engine.submit(r["prompt"], r["max_tokens"], tenant=r["tenant"],
                                            arrival_s=r["arrival_s"] if src is None else engine.now())
                    pending.remove(i)
            signal()
            for i, req in reqs.items():
                until = workload[i]["until"]
                if not until or req.done:
                    continue
                if until[0] in mine:  # both here: as run_local's Triggers
                    o = reqs.get(until[0])
                    first = o.token_times_s[0] if o is not None and o.done and o.token_times_s else None
                else:
                    f = signals / f"done-{until[0]}"
                    first = float(f.read_text()) - engine._t0 if f.exists() else None
                if first is not None and sum(t > first for t in req.token_times_s) >= until[1]:
                    engine.cancel(req)
            if engine.has_work:
                engine.step()
            elif pending:
                time.sleep(0.001)
        engine.flush()
    signal()  # the last step's tokens were read by the flush: a request it finished says so now
    return reqs


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
    p.add_argument("--bits", type=int, default=None, help="quantize the preset's weights to this many bits")
    p.add_argument("--split-tenant", default=None, metavar="TENANT",
                   help="run only this tenant's requests, the others in a second process (run_split)")
    p.add_argument("--signals", default=None, help="the folder of the split processes' signal files")
    dev = p.add_mutually_exclusive_group()
    dev.add_argument("--device", type=int, default=None, help="the GPU this process uses (CUDA_VISIBLE_DEVICES)")
    dev.add_argument("--device-by-rank", action="store_true", help="rank r uses GPU r (under mlx.launch)")
    args = p.parse_args(argv)
    if args.split_tenant and not args.signals:
        p.error("--split-tenant needs --signals DIR")
    policy = _normal_priority()
    if args.device is not None or args.device_by_rank:  # before MLX loads: it reads the variable once
        os.environ["CUDA_VISIBLE_DEVICES"] = str(args.device if args.device is not None else os.environ["MLX_RANK"])

    from mlxlab.engine import disagg
    from mlxlab.engine.models import load_model

    workload = disagg.check_workload(json.loads(Path(args.workload).read_text()))
    model = load_model(args.model, dtype=args.dtype, bits=args.bits)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rounds, t_load, t_init = [], time.perf_counter(), None
    if args.split_tenant:
        name = f"split-{args.split_tenant}"
        for k in range(args.rounds):
            signals = Path(args.signals) / f"round{k}"
            signals.mkdir(parents=True, exist_ok=True)
            eng = disagg.Engine(model, policy=args.policy, chunk_size=args.chunk_size)
            c0 = time.process_time()
            reqs = run_split(eng, workload, args.split_tenant, signals)
            rounds.append({"requests": {i: _request(r) for i, r in reqs.items()}, "steps": _steps(eng),
                           "cpu_s": time.process_time() - c0, "t0_abs": eng._t0})
    elif args.local:
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

    doc = {"role": name, "blas": blas_in_use(), "model": args.model, "dtype": args.dtype, "bits": args.bits,
           "policy": args.policy,
           "chunk_size": args.chunk_size, "env": _threads(), "seconds": time.perf_counter() - t_load, "init_s": t_init,
           "ring_threads_idle_wait": None if args.local or args.split_tenant else comms.idle_wait,
           "started_scheduling": policy,
           "ring_wait_duty_cycle_s": None if args.local or args.split_tenant or not comms.idle_wait
           else [comms.awake_s, comms.period_s],
           "rounds": rounds}
    (out / f"{name}.json").write_text(json.dumps(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
