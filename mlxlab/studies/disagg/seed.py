"""Disaggregation at the case study's scale (issue 21): what a second machine buys seed 001's chat,
set beside the case study's own two fixes, a bigger prefix cache and the admission gate; all on
the simulator with the published profile of the 35B MoE on the M4 Max
(:func:`mlxlab.sim.published.seed001_cost_model`).

The scene is the case study's incident: an agent chat at ``chat_context_tokens`` of context is
streaming when ``batch_prompt_tokens`` (several benchmark workers' fresh prompts, 10-25k tokens)
arrive together with the next turn of another, warm session (its ``chat_context_tokens`` of
context plus ``turn_tokens`` new ones). Measured per setting: the streaming chat's gaps over the
batch's prefill window (its arrival to the last batch prompt's first token), the warm session's
TTFT (what a prefix cache is for) and the batch prompts' TTFT.

Settings (:data:`SETTINGS`), one engine at the seed's chunk of 2,048 tokens or a prefill machine
and a decode machine (:func:`mlxlab.studies.disagg.sim.simulate_disagg`, the KV moving over
the transfer line measured by ``bench disagg``): no fix (``interleave``, one decode step per
chunk, as the case study's mlx-vlm); the admission gate with a decode window held open between
chunks; the gate and a prefix cache holding the warm session; two machines; two machines with the
prefix cache on the prefill machine (the restored KV still travels to the decode machine). The
prefix cache is modelled by :class:`PrefixCacheSim` (a restore is charged nothing).

No MLX is needed to run it, but :mod:`mlxlab.studies.disagg.sim` reads the workload through
:mod:`mlxlab.engine.disagg`, which imports mlx.
"""

from __future__ import annotations

import math
import random
from typing import Dict, Optional, Sequence

import numpy as np

from mlxlab.sim.simulator import Simulator
from mlxlab.studies.disagg.sim import PrefillSim, simulate_disagg, simulate_single
from mlxlab.studies.rules import common_prefix

#: The scene's sizes: the case study's chat context, four workers' fresh prompts across its
#: 10-25k range, a short answer each (their KV has a reader, so it travels), the seed's chunk, the
#: gate of :mod:`mlxlab.studies.seed_scale.run` (big prompts from 4,096 tokens, a 1 s decode window).
SCENE = {"chat_context_tokens": 23_000, "batch_prompt_tokens": (10_000, 15_000, 20_000, 25_000),
         "batch_output_tokens": 8, "turn_tokens": 64, "turn_output_tokens": 8, "chunk_size": 2048,
         "window_s": 1.0, "big_prompt_tokens": 4096, "warm_tokens": 8, "after_tokens": 2, "seed": 0}

#: setting -> (topology, policy of the engine or the prefill machine, prefix cache holding the warm session)
SETTINGS = {"one machine": ("single", "interleave", False),
            "one machine, gate": ("single", "admission_gate_window", False),
            "one machine, gate + prefix cache": ("single", "admission_gate_window", True),
            "two machines": ("disagg", "interleave", False),
            "two machines + prefix cache": ("disagg", "interleave", True)}

VOCAB, MAX_CONTEXT = 1000, 262_144  # the seed scenes' vocabulary and context (mlxlab.studies.seed_scale.run)


class PrefixCacheSim:
    """A simulator mix-in with a prefix cache holding ``cached_prefixes`` (token lists): a new
    prompt starts from its longest cached prefix, as the engine's ``_restore`` does. The restore
    is charged nothing (the cost model has no term for it: from memory it is a copy, small
    against the prefill it saves), and the cache holds every prefix given (the seed's cache
    sized for its sessions)."""

    def __init__(self, *args, cached_prefixes: Sequence[Sequence[int]] = (), **kwargs):
        super().__init__(*args, **kwargs)
        self.cached_prefixes = [list(p) for p in cached_prefixes]

    def _restore(self, seq) -> None:
        prompt = seq.req.prompt
        n = max((common_prefix(p, prompt) for p in self.cached_prefixes), default=0)
        n = min(n, seq.prefill_tokens)  # the last prompt token is the first decode input
        if n:
            seq.prefilled = seq.req.cached_tokens = n


class CachedSim(PrefixCacheSim, Simulator):
    """One simulated engine with a prefix cache (:class:`PrefixCacheSim`)."""


class CachedPrefillSim(PrefixCacheSim, PrefillSim):
    """A simulated prefill machine with a prefix cache (:class:`PrefixCacheSim`)."""


def seed_workload(scene: dict, solo_itl_s: float, batch_s: float) -> tuple:
    """The scene as a disaggregation workload (:func:`mlxlab.engine.disagg.check_workload`): the
    streaming chat (0), the batch prompts (1..W, arriving once the chat has ``warm_tokens``
    tokens, smallest first), the warm session's next turn (W+1, arriving with them); the chat is
    cancelled ``after_tokens`` tokens after the largest batch prompt is done and asks for enough
    tokens to stream through ``batch_s`` seconds (the batch's prefill) three times over. Returns
    (workload, the warm session's cached context)."""
    rng = random.Random(scene["seed"])

    def prompt(n):
        return [rng.randrange(1, VOCAB) for _ in range(n)]

    sizes = sorted(scene["batch_prompt_tokens"])
    last = len(sizes)  # the largest batch prompt: prefilled last in arrival order and when all are chunked at once
    after = [0, scene["warm_tokens"]]
    cached = prompt(scene["chat_context_tokens"]) + [0] * scene["turn_output_tokens"]  # its last turn, answered
    chat = {"prompt": prompt(scene["chat_context_tokens"]), "tenant": "chat", "until": [last, scene["after_tokens"]],
            "max_tokens": int(3 * batch_s / solo_itl_s) + 64}
    batch = [{"prompt": prompt(n), "max_tokens": scene["batch_output_tokens"], "tenant": "batch", "after": after}
             for n in sizes]
    turn = {"prompt": cached + prompt(scene["turn_tokens"]), "max_tokens": scene["turn_output_tokens"],
            "tenant": "warm turn", "after": after}
    return [chat] + batch + [turn], cached


def _figures(reqs: Dict[int, object], n_batch: int, moves: Optional[dict] = None) -> dict:
    chat, batch, turn = reqs[0], [reqs[i] for i in range(1, n_batch + 1)], reqs[n_batch + 1]
    t0, t1 = min(r.arrival_s for r in batch), max(r.token_times_s[0] for r in batch)
    tt = chat.token_times_s
    gaps = np.array([b - a for a, b in zip(tt, tt[1:]) if b > t0 and a < t1])
    out = {"chat_itl_p50_ms": 1e3 * float(np.percentile(gaps, 50)), "chat_itl_p99_ms": 1e3 * float(np.percentile(gaps, 99)),
           "chat_worst_gap_ms": 1e3 * float(gaps.max()), "chat_gaps": int(gaps.size),
           "warm_turn_ttft_s": turn.ttft_s,
           "batch_ttft_p50_s": float(np.median([r.ttft_s for r in batch])), "batch_last_first_token_s": t1 - t0}
    if moves is not None:
        out["warm_turn_kv_bytes"] = moves[n_batch + 1]["bytes"]
        out["warm_turn_transfer_s"] = moves[n_batch + 1]["transfer_s"]
    return out


def seed_disagg_study(transfer: dict, *, cost_model=None, settings: Sequence[str] = tuple(SETTINGS),
                      **scene) -> dict:
    """Every setting of :data:`SETTINGS` on the scene (:data:`SCENE`, updated by ``scene``), the
    KV moving between the two machines over ``transfer`` (``latency_s``, ``s_per_byte``:
    :func:`mlxlab.studies.disagg.sim.fit_transfer` of measured sends). Returns a JSON-ready dict:
    ``settings`` (name -> the figures of :func:`_figures`), ``solo_itl_ms`` (the chat's decode
    step alone at its context, from the cost model), ``transfer``, ``kv_bytes_per_token`` and
    ``scene``."""
    from mlxlab.sim.published import seed001_cost_model, seed001_figures

    bad = [s for s in settings if s not in SETTINGS]
    if bad or not settings:
        raise ValueError(f"unknown seed-scale setting(s) {bad or settings}; choose from {list(SETTINGS)}")
    sc = {**SCENE, **scene}
    cm = cost_model or seed001_cost_model()
    kv_bytes = int(seed001_figures()["kv_kb_per_token"]["value"] * 1000)
    solo = float(cm.predict(1, sc["chat_context_tokens"] + 1, []))
    # the batch's prefill in one chunk each (a floor), and a gate's decode window after every chunk
    chunks = sum(math.ceil(n / sc["chunk_size"]) for n in sc["batch_prompt_tokens"])
    batch_s = sum(float(cm.predict(0, 0, [(n, 0)])) for n in sc["batch_prompt_tokens"]) + chunks * sc["window_s"]
    work, cached = seed_workload(sc, solo, batch_s)
    model = {"vocab_size": VOCAB, "max_position_embeddings": MAX_CONTEXT}
    n_batch = len(sc["batch_prompt_tokens"])
    out = {}
    for name in settings:
        topology, policy, prefix = SETTINGS[name]
        opts = {"big_prompt_tokens": sc["big_prompt_tokens"]} if policy.startswith("admission_gate") else {}
        if policy == "admission_gate_window":
            opts["window_s"] = sc["window_s"]
        if prefix:
            opts["cached_prefixes"] = [cached]
        if topology == "single":
            reqs = simulate_single(cm, work, model=model, policy=policy, chunk_size=sc["chunk_size"],
                                   sim_cls=CachedSim if prefix else Simulator, **opts)
            out[name] = _figures(reqs, n_batch)
        else:
            reqs, moves = simulate_disagg(cm, work, model=model, transfer=transfer, policy=policy,
                                          chunk_size=sc["chunk_size"], kv_bytes=kv_bytes,
                                          prefill_cls=CachedPrefillSim if prefix else PrefillSim, **opts)
            out[name] = _figures(reqs, n_batch, moves)
        out[name].update({"topology": topology, "policy": policy, "prefix_cache": prefix})
    return {"settings": out, "solo_itl_ms": 1e3 * solo, "transfer": dict(transfer), "kv_bytes_per_token": kv_bytes,
            "scene": {k: (list(v) if isinstance(v, tuple) else v) for k, v in sc.items()},
            "cost_model": getattr(cm, "source", None)}


def format_table(res: dict) -> str:
    """The settings' figures, one line each."""
    lines = [f"seed scale (solo chat ITL {res['solo_itl_ms']:.1f} ms; KV over {res['transfer']['latency_s'] * 1e3:.1f} ms"
             f" + {res['transfer']['s_per_byte'] * 1e9:.2f} ns/byte)"]
    for name, r in res["settings"].items():
        lines.append(f"  {name:34s} chat ITL p50 {r['chat_itl_p50_ms']:8.1f} ms p99 {r['chat_itl_p99_ms']:8.1f} ms worst "
                     f"{r['chat_worst_gap_ms']:8.1f} ms; warm turn TTFT {r['warm_turn_ttft_s']:6.2f} s; batch TTFT p50 "
                     f"{r['batch_ttft_p50_s']:6.1f} s, last {r['batch_last_first_token_s']:6.1f} s")
    return "\n".join(lines)
