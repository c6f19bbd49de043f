"""Disaggregation simulated (issue 21, item 4): two :class:`mlxlab.sim.Simulator` executors, a
prefill worker and a decode worker, composed on one virtual timeline with a measured KV transfer
cost, beside one simulated engine; validated against the CPU measurement
(:mod:`mlxlab.studies.disagg.run`, ``data/results/cpu/disagg.json``).

The composition follows :mod:`mlxlab.engine.disagg`: the prefill simulator runs only chunks; when a
prompt's prefill completes (charged to the end of its step) it is charged its first decode forward
(batch 1 at the prompt's context, the cost model's decode prediction) and its KV travels for
``transfer_s(bytes)`` (a line fitted to the measured transfers: a fixed latency and seconds per
byte); the decode simulator then adopts it, its first token read at the arrival, and decodes it in
its batch. The two clocks advance in turn, the one behind first; a triggered request (the
document) reaches the prefill simulator when the decode simulator's step fires it. The simulator
itself is used as it is (``mlxlab.sim`` is not changed): the two subclasses here only move a
finished prefill from one to the other.
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence

import numpy as np

from mlxlab.core.presets import preset_config
from mlxlab.core.request import StepRecord
from mlxlab.sim.simulator import Simulator

_READ = StepRecord(-1, 1.0, 1.0, "", [], [])  # a token read outside any step (ended: no policy sees it)


def kv_bytes_per_token(model: str, dtype_bytes: int = 4) -> int:
    """KV bytes one position of preset ``model`` holds: layers x KV heads x head dim x (keys,
    values) x dtype bytes (the disaggregated run sends exactly this per prompt position)."""
    c = preset_config(model)
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    return int(c["num_hidden_layers"] * c.get("num_key_value_heads", c["num_attention_heads"]) * head_dim * 2
               * dtype_bytes)


def fit_transfer(transfers: Sequence[dict]) -> dict:
    """``transfer_s = latency_s + bytes * s_per_byte``, least squares over measured transfers
    (each with ``bytes`` and ``transfer_s``); with one size only, the latency is the mean and the
    slope 0."""
    x = np.array([float(t["bytes"]) for t in transfers])
    y = np.array([float(t["transfer_s"]) for t in transfers])
    if len(set(x.tolist())) < 2:
        return {"latency_s": float(y.mean()), "s_per_byte": 0.0, "n": len(x)}
    slope, intercept = np.polyfit(x, y, 1)
    return {"latency_s": max(0.0, float(intercept)), "s_per_byte": max(0.0, float(slope)), "n": len(x)}


class PrefillSim(Simulator):
    """A simulator that only prefills: a finished prompt leaves it, noted in ``finished``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.finished: list = []

    def _prefill_done(self, seq) -> None:
        super()._prefill_done(seq)
        self._ready.remove(seq)
        self.finished.append(seq)

    def submit(self, *args, **kwargs):
        req = super().submit(*args, **kwargs)
        seq = self._seqs[req.id]
        if seq in self._ready:  # a one-token prompt: nothing to prefill
            self._ready.remove(seq)
            self.finished.append(seq)
        return req


class DecodeSim(Simulator):
    """A simulator whose batch adopts prompts prefilled elsewhere (:meth:`adopt`)."""

    def adopt(self, prompt: List[int], max_tokens: int, tenant: str, arrival_s: float, prefill_start_s: float,
              t: float):
        req = self._enqueue(prompt, max_tokens, tenant=tenant, arrival_s=arrival_s, stop_tokens=())
        seq = self._seqs[req.id]
        seq.prefilled = seq.prefill_tokens
        req.prefill_start_s = prefill_start_s
        if seq in self._queue:
            self._queue.remove(seq)
            self._ready.append(seq)
        seq.issued = 1
        self._deliver(_READ, [seq], [self.output_token], t)
        if req.done:
            self._ready.remove(seq)
        return req


def simulate_single(profile, workload: List[dict], *, model, policy: str = "interleave",
                    chunk_size: int = 512, sim_cls=Simulator, **options) -> Dict[int, object]:
    """The workload on one simulated engine, a ``sim_cls`` built with ``options`` (policy options,
    and a subclass's own), triggers checked between steps: index -> request. ``model``: a preset
    name or a config dict."""
    from mlxlab.engine.disagg import Triggers, check_workload

    work = check_workload(workload)
    sim = sim_cls.for_model(model, profile, policy=policy, chunk_size=chunk_size, **options)
    trig, reqs = Triggers(work), {}
    for i, r in enumerate(work):
        if r["after"] is None:
            reqs[i] = sim.submit(r["prompt"], r["max_tokens"], tenant=r["tenant"], arrival_s=r["arrival_s"])
    while sim.has_work or trig.pending:
        for i in trig.fired(reqs):
            reqs[i] = sim.submit(work[i]["prompt"], work[i]["max_tokens"], tenant=work[i]["tenant"])
        trig.cancel(sim, reqs)
        if sim.step() is None and not sim.has_work and trig.pending:
            raise RuntimeError(f"requests {trig.pending} wait on triggers that can no longer fire")
    sim.flush()
    return reqs


def simulate_disagg(profile, workload: List[dict], *, model, transfer: dict, policy: str = "interleave",
                    chunk_size: int = 512, dtype_bytes: int = 4, kv_bytes: Optional[int] = None,
                    prefill_cls=PrefillSim, **options) -> tuple:
    """The workload on a simulated prefill worker (a ``prefill_cls`` built with ``options``:
    policy options, and a subclass's own) and decode worker (module docstring). ``model``: a
    preset name, or a config dict with ``kv_bytes`` (KV bytes per prompt position; default from
    the preset). Returns (index -> the decode side's request, index -> {bytes, transfer_s,
    first_s, arrival at the decode worker})."""
    from mlxlab.engine.disagg import Triggers, check_workload

    work = check_workload(workload)
    pre = prefill_cls.for_model(model, profile, policy=policy, chunk_size=chunk_size, **options)
    dec = DecodeSim.for_model(model, profile, policy="interleave", chunk_size=chunk_size)
    per_token = kv_bytes if kv_bytes is not None else kv_bytes_per_token(model, dtype_bytes)
    trig, reqs, moves, index_of, inflight = Triggers(work), {}, {}, {}, []
    for i, r in enumerate(work):
        if r["after"] is None:
            index_of[pre._next_request] = i
            pre.submit(r["prompt"], r["max_tokens"], tenant=r["tenant"], arrival_s=r["arrival_s"])

    def hand_offs() -> None:  # the prefill side's finished prompts: first forward, then the wire
        for seq in pre.finished:
            first = pre.now() + max(0.0, pre.cost_model.predict(1, seq.prefill_tokens, []))
            pre.advance_to(first)
            nbytes = per_token * len(seq.req.prompt) if seq.req.max_tokens > 1 else 0
            t = first + transfer["latency_s"] + nbytes * transfer["s_per_byte"]
            i = index_of[seq.req.id]
            moves[i] = {"bytes": nbytes, "transfer_s": t - first, "first_s": first, "arrives_s": t}
            inflight.append((t, i, seq.req))
        pre.finished.clear()
        inflight.sort(key=lambda x: x[0])

    while pre.has_work or pre.finished or dec.has_work or inflight or trig.pending:  # finished: not yet handed off
        hand_offs()
        while inflight and inflight[0][0] <= dec.now():
            t, i, req = inflight.pop(0)
            reqs[i] = dec.adopt(req.prompt, req.max_tokens, req.tenant, req.arrival_s, req.prefill_start_s, dec.now())
        if pre.has_work and (pre.now() <= dec.now() or not dec.has_work):
            pre.step()
            continue
        if dec.has_work:
            dec.step()
        elif inflight:
            dec.advance_to(inflight[0][0])
            continue
        for i in trig.fired(reqs):
            index_of[pre._next_request] = i
            pre.advance_to(dec.now())
            pre.submit(work[i]["prompt"], work[i]["max_tokens"], tenant=work[i]["tenant"], arrival_s=dec.now())
        trig.cancel(dec, reqs)
        if not (pre.has_work or dec.has_work or inflight) and trig.pending:
            raise RuntimeError(f"requests {trig.pending} wait on triggers that can no longer fire")
    dec.flush()
    return reqs, moves


def figures(reqs: Dict[int, object]) -> dict:
    """The measured study's figures (:func:`mlxlab.studies.disagg.run.run_figures`) of simulated requests."""
    from mlxlab.studies.contention.run import pct

    chat, doc = reqs[0], reqs[1]
    t_doc, t_first = doc.arrival_s, doc.token_times_s[0]
    tt = chat.token_times_s
    window = [b - a for a, b in zip(tt, tt[1:]) if b > t_doc and a < t_first]
    return {"chat_itl_p50_ms": 1e3 * pct(window, 50), "chat_itl_p99_ms": 1e3 * pct(window, 99),
            "doc_ttft_s": t_first - t_doc, "chat_tokens": len(tt)}


def validate(measured: dict, profile: str = "cpu-small") -> dict:
    """Simulate the measured study's workload (its config) on ``profile`` for one engine and for the
    two workers, the transfer line fitted to its disaggregated runs; each figure beside the
    measured median and their ratio (simulated / measured)."""
    from mlxlab.studies.disagg.run import contention_workload

    cfg = measured["config"]
    c = preset_config(cfg["model"])
    work = contention_workload(int(c["vocab_size"]), cfg["chat_context"], cfg["doc_tokens"], cfg["doc_max_tokens"],
                               seed=cfg["seed"])
    transfers = [t for r in measured["runs"]["disagg"] for t in r["transfers"].values() if t.get("transfer_s")]
    line = fit_transfer(transfers)
    kw = dict(model=cfg["model"], policy=cfg["policy"], chunk_size=cfg["chunk_size"])
    sims = {"single": figures(simulate_single(profile, work, **kw))}
    reqs, moves = simulate_disagg(profile, work, transfer=line, **kw)
    sims["disagg"] = {**figures(reqs), "doc_transfer_s": moves[1]["transfer_s"], "doc_kv_bytes": moves[1]["bytes"]}
    out = {"profile": profile, "transfer_fit": line, "settings": {}}
    for name, sim in sims.items():
        row = measured["summary"][name]
        out["settings"][name] = {k: {"simulated": v, "measured": row[k]["median"] if k in row else None,
                                     "sim_over_measured": _ratio(v, row[k]["median"] if k in row else None)}
                                 for k, v in sim.items() if k != "chat_tokens"}
    return out


def _ratio(a, b) -> Optional[float]:
    if a is None or b is None or not math.isfinite(float(a)) or not math.isfinite(float(b)) or float(b) == 0:
        return None
    return float(a) / float(b)
