"""The speculative-decoding study: every quantity of the analytic model measured on real runs.

``a`` and tokens per pass come from the accept/reject record of :func:`speculative_generate`,
``c`` and ``v`` from timed decode steps and verification passes of the two models
(:func:`measure_cost_ratio`), and the end-to-end speedup from timing against mlx-lm's
target-alone ``generate_step``; :func:`teacher_forced_agreement` gives the acceptance greedy
speculation would see on real text; :func:`verdicts` scores seed 000's claims from a study.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

from mlxlab.core.presets import module_of
from mlxlab.engine.speculative import (
    analytic_speedup,
    estimate_acceptance,
    expected_tokens_per_pass,
    mlx_lm_speculative,
    prefill_cache,
    speculative_generate,
    target_generate,
)

DEFAULT_KS = (1, 2, 3, 4, 6, 8)
WHITESPACE = b" \t\n\r"


def _median(xs):
    return statistics.median(xs) if xs else float("nan")


def _timed(fn) -> float:
    t0 = time.perf_counter()
    mx.eval(fn())
    return time.perf_counter() - t0


# --------------------------------------------------------------------------- costs and agreement


def measure_cost_ratio(target, draft, *, context: int = 128, steps: int = 64,
                       ks: Iterable[int] = (), repeats: int = 1) -> dict:
    """Decode-step cost of the two models and the draft/target cost ratio ``c``.

    Both models hold ``context`` cached tokens; then, ``steps * repeats`` times, a synchronised
    one-token decode step (argmax included) of the target, one of the draft and, for each ``k``
    in ``ks``, a (k+1)-token verification pass of the target are timed in turn, every cache
    trimmed back after each pass (interleaving keeps a changing machine load from biasing the
    ratio). Returns the medians, ``c`` = draft / target step and ``v[k]`` = verification pass /
    target step (1 in the textbook model).
    """
    ks = list(ks)
    tm, dm = module_of(target), module_of(draft)
    ctx = [(32 + i) % 128 for i in range(context)]
    tc, dc = make_prompt_cache(tm), make_prompt_cache(dm)
    prefill_cache(tm, tc, ctx)
    prefill_cache(dm, dc, ctx)
    x1 = mx.array([[32]], mx.uint32)
    xs = {k: mx.array([[32] * (k + 1)], mx.uint32) for k in ks}

    def one(model, cache, x):
        t = _timed(lambda: mx.argmax(model(x, cache=cache)[0], axis=-1))
        trim_prompt_cache(cache, x.shape[1])
        return t

    tt, dt = [], []
    vt: Dict[int, List[float]] = {k: [] for k in ks}
    for i in range(steps * repeats + 3):
        a, b = one(tm, tc, x1), one(dm, dc, x1)
        vs = {k: one(tm, tc, xs[k]) for k in ks}
        if i >= 3:  # warm-up
            tt.append(a)
            dt.append(b)
            for k in ks:
                vt[k].append(vs[k])
    t_step, d_step = _median(tt), _median(dt)
    return {
        "context": context,
        "target_step_s": t_step,
        "draft_step_s": d_step,
        "c": d_step / t_step,
        "verify_s": {k: _median(v) for k, v in vt.items()},
        "v": {k: _median(v) / t_step for k, v in vt.items()},
    }


def teacher_forced_agreement(target, draft, data, *, seq_len: int = 256,
                             max_windows: Optional[int] = 64) -> dict:
    """How often the draft's greedy choice equals the target's on real text (held-out code).

    On non-overlapping windows of ``data`` (bytes, evenly spaced, as in
    :func:`mlxlab.train.tiny.evaluate`) both models predict every next byte from the true prefix;
    ``agreement`` is the fraction of positions where their argmaxes match: the per-token
    acceptance probability of greedy speculation if decoding followed text like ``data``.
    Also split by whether the true next byte is whitespace, and each model's top-1 accuracy.
    """
    toks = np.frombuffer(bytes(data), dtype=np.uint8).astype(np.int32)
    n_win = (len(toks) - 1) // seq_len
    idx = np.arange(n_win)
    if max_windows is not None and max_windows < n_win:
        idx = np.unique(np.linspace(0, n_win - 1, max_windows).round().astype(int))
    tm, dm = module_of(target), module_of(draft)
    agree = ws = agree_ws = t_ok = d_ok = n = 0
    for s in range(0, len(idx), 16):
        w = np.stack([toks[i * seq_len:(i + 1) * seq_len + 1] for i in idx[s:s + 16]])
        x, y = mx.array(w[:, :-1]), w[:, 1:]
        pt = np.array(mx.argmax(tm(x), axis=-1))
        pd = np.array(mx.argmax(dm(x), axis=-1))
        same = pt == pd
        is_ws = np.isin(y, list(WHITESPACE))
        agree += int(same.sum())
        agree_ws += int((same & is_ws).sum())
        ws += int(is_ws.sum())
        t_ok += int((pt == y).sum())
        d_ok += int((pd == y).sum())
        n += y.size
    return {"agreement": agree / n,
            "agreement_whitespace": agree_ws / ws if ws else float("nan"),
            "agreement_other": (agree - agree_ws) / (n - ws) if n > ws else float("nan"),
            "whitespace_fraction": ws / n,
            "target_top1": t_ok / n, "draft_top1": d_ok / n, "positions": n, "seq_len": seq_len}


def _whitespace_fraction(seqs) -> float:
    ws = set(WHITESPACE)
    tot = sum(len(s) for s in seqs)
    return sum(1 for s in seqs for t in s if t in ws) / tot if tot else float("nan")


# --------------------------------------------------------------------------- the study

_TIMES = ("total", "decode", "draft", "verify", "mlx_lm_total")
_COUNTS = ("accepted", "proposed", "target_passes", "draft_steps")


@dataclass
class _KRecord:
    """One draft length over the study: per-repeat time sums over prompts, and the first
    repeat's accept/reject record and counts."""
    times: Dict[str, List[float]] = field(default_factory=lambda: {f: [] for f in _TIMES})
    rounds: List[tuple] = field(default_factory=list)
    counts: Dict[str, int] = field(default_factory=lambda: dict.fromkeys(_COUNTS + ("tokens",), 0))
    identical: bool = True
    identical_mlx_lm: bool = True
    mlx_lm_accepted: int = 0


class _Runs:
    """Everything the repeats measured: the baseline's per-repeat times and its tokens per
    prompt, and a :class:`_KRecord` per draft length."""

    def __init__(self, ks: List[int], n_prompts: int):
        self.ks = ks
        self.base: Dict[str, List[float]] = {"total": [], "decode": []}
        self.base_tokens: List[Optional[List[int]]] = [None] * n_prompts
        self.per_k = {k: _KRecord() for k in ks}


def _run_repeat(runs: _Runs, target, draft, prompts, max_tokens: int, mlx_lm: bool, first: bool) -> None:
    """One repeat: per prompt the target alone, then each ``k`` (and mlx-lm's speculation);
    interleaving by prompt spreads a changing machine load over all methods."""
    base = {"total": 0.0, "decode": 0.0}
    sums = {k: dict.fromkeys(_TIMES, 0.0) for k in runs.ks}
    for i, p in enumerate(prompts):
        b = target_generate(target, p, max_tokens)
        base["total"] += b["times"]["total"]
        base["decode"] += b["times"]["decode"] * max_tokens / max(1, max_tokens - 1)
        if runs.base_tokens[i] is None:
            runs.base_tokens[i] = b["tokens"]
        ref = runs.base_tokens[i]
        for k in runs.ks:
            rec, x = runs.per_k[k], speculative_generate(target, draft, p, max_tokens, k)
            for f in ("total", "decode", "draft", "verify"):
                sums[k][f] += x["times"][f]
            rec.identical &= x["tokens"] == ref
            if first:
                rec.rounds += x["rounds"]
                for c in _COUNTS:
                    rec.counts[c] += x[c]
                rec.counts["tokens"] += len(x["tokens"])
            if mlx_lm:
                m = mlx_lm_speculative(target, draft, p, max_tokens, k)
                sums[k]["mlx_lm_total"] += m["times"]["total"]
                rec.identical_mlx_lm &= m["tokens"] == ref
                if first:
                    rec.mlx_lm_accepted += m["accepted"]
    for f in base:
        runs.base[f].append(base[f])
    for k in runs.ks:
        for f in _TIMES:
            runs.per_k[k].times[f].append(sums[k][f])


def _row(k: int, rec: _KRecord, cost: dict, base: Dict[str, List[float]], t_tok: float, mlx_lm: bool) -> dict:
    """One draft length's record: acceptance, tokens per pass measured and predicted, and the
    speedup measured (with each repeat's, paired with that repeat's baseline), predicted by the
    analytic model, and accounted from in-loop times."""
    s, cnt = rec.times, rec.counts
    base_total, base_decode = _median(base["total"]), _median(base["decode"])
    dec_repeats = [b / x for b, x in zip(base["decode"], s["decode"])]
    a = estimate_acceptance(rec.rounds)
    v = cost["v"].get(k, float("nan")) if cost.get("v") else float("nan")
    sp_tot, sp_dec = _median(s["total"]), _median(s["decode"])
    c_in = _median(s["draft"]) / cnt["draft_steps"] / t_tok if cnt["draft_steps"] else 0.0
    v_in = _median(s["verify"]) / cnt["target_passes"] / t_tok
    E = expected_tokens_per_pass(a, k) if a == a else float("nan")
    row = {
        "k": k,
        "acceptance_rate": cnt["accepted"] / cnt["proposed"] if cnt["proposed"] else float("nan"),
        "a_hat": a,
        "accepted": cnt["accepted"], "proposed": cnt["proposed"],
        "target_passes": cnt["target_passes"], "draft_steps": cnt["draft_steps"],
        "accept_hist": [sum(1 for kk, n in rec.rounds if kk == k and n == j) for j in range(k + 1)],
        "tokens_per_pass": cnt["tokens"] / cnt["target_passes"],
        "tokens_per_pass_analytic": E,
        "spec_s": sp_tot, "spec_decode_s": sp_dec,
        "spec_draft_s": _median(s["draft"]), "spec_verify_s": _median(s["verify"]),
        "speedup": base_total / sp_tot,
        "speedup_decode": base_decode / sp_dec,
        "speedup_repeats": [b / x for b, x in zip(base["total"], s["total"])],
        "speedup_decode_repeats": dec_repeats,
        "speedup_decode_paired": _median(dec_repeats),
        "speedup_analytic": analytic_speedup(a, k, cost["c"]) if a == a else float("nan"),
        "speedup_analytic_v": analytic_speedup(a, k, cost["c"], v) if a == a and v == v else float("nan"),
        "v": v,
        "c_in_loop": c_in, "v_in_loop": v_in,
        "speedup_accounting": E / (k * c_in + v_in) if a == a else float("nan"),
        "identical": rec.identical,
    }
    if mlx_lm:
        row.update({"mlx_lm_spec_s": _median(s["mlx_lm_total"]),
                    "speedup_mlx_lm": base_total / _median(s["mlx_lm_total"]),
                    "mlx_lm_acceptance_rate": (rec.mlx_lm_accepted / cnt["proposed"] if cnt["proposed"]
                                               else float("nan")),
                    "identical_mlx_lm": rec.identical_mlx_lm})
    return row


def _row_line(r: dict) -> str:
    return (f"  k={r['k']}: a={r['acceptance_rate']:.3f} (a_hat {r['a_hat']:.3f}), tokens/pass "
            f"{r['tokens_per_pass']:.2f} (analytic {r['tokens_per_pass_analytic']:.2f}), speedup {r['speedup']:.3f} "
            f"(decode {r['speedup_decode']:.3f}; analytic {r['speedup_analytic']:.3f}, with v "
            f"{r['speedup_analytic_v']:.3f}, in-loop accounting {r['speedup_accounting']:.3f}), "
            f"identical {r['identical']}")


def speculation_study(target, draft, prompts: Sequence[Sequence[int]],
                      ks: Iterable[int] = DEFAULT_KS, *, max_tokens: int = 128, repeats: int = 3,
                      mlx_lm: bool = True, cost: Optional[dict] = None,
                      log=None) -> dict:
    """Measure speculative decoding of ``target`` with ``draft`` on ``prompts`` for each ``k``.

    For each repeat and prompt, in turn: the target alone (mlx-lm ``generate_step``), then
    :func:`speculative_generate` with each ``k`` (and, with ``mlx_lm``, mlx-lm's
    ``speculative_generate_step``). Each method's time is summed over prompts; reported values
    are medians over repeats. Per ``k``: acceptance rate (accepted / proposed), ``a_hat``
    (:func:`estimate_acceptance`), tokens per target pass measured and predicted
    (:func:`expected_tokens_per_pass` at ``a_hat``), end-to-end and decode-only speedup over the
    target alone (also per repeat, each against that repeat's baseline; ``speedup_decode_paired``
    is the median of the per-repeat decode speedups), and the analytic speedup three ways:
    ``speedup_analytic`` with ``c`` from :func:`measure_cost_ratio` and ``v = 1`` (the textbook
    formula), ``speedup_analytic_v`` with the measured verification cost ``v[k]`` too, and ``speedup_accounting`` with ``c`` and ``v``
    taken from the draft and verification time actually spent inside the runs, relative to the
    baseline's time per token (what is left between it and the measured speedup is loop
    overhead). ``identical`` records whether every output equals the target's greedy output.
    """
    ks = list(ks)
    say = log or (lambda s: None)
    prompts = [list(map(int, p)) for p in prompts]
    # warm-up: the first call of each shape pays for graph set-up
    target_generate(target, prompts[0], min(8, max_tokens))
    for k in ks:
        speculative_generate(target, draft, prompts[0], min(8, max_tokens), k)
    if cost is None:
        cost = measure_cost_ratio(target, draft, ks=ks)
    say(f"[speculation] target step {cost['target_step_s'] * 1e3:.2f} ms, draft step "
        f"{cost['draft_step_s'] * 1e3:.2f} ms, c = {cost['c']:.3f}")

    runs = _Runs(ks, len(prompts))
    for r in range(repeats):
        _run_repeat(runs, target, draft, prompts, max_tokens, mlx_lm, first=r == 0)

    b_tot, b_dec = _median(runs.base["total"]), _median(runs.base["decode"])
    n_tok = len(prompts) * max_tokens
    t_tok = b_dec / n_tok   # the baseline's decode time per token
    rows = [_row(k, runs.per_k[k], cost, runs.base, t_tok, mlx_lm) for k in ks]
    for row in rows:
        say(_row_line(row))
    return {
        "config": {"ks": ks, "max_tokens": max_tokens, "repeats": repeats, "num_prompts": len(prompts),
                   "prompt_lengths": [len(p) for p in prompts]},
        "cost": cost,
        "baseline": {"total_s": b_tot, "decode_s": b_dec, "tok_s": n_tok / b_tot,
                     "decode_tok_s": n_tok / b_dec, "decode_s_per_token": t_tok,
                     "whitespace_fraction": _whitespace_fraction(runs.base_tokens),
                     "method": "mlx_lm.generate.generate_step (greedy)"},
        "outputs": runs.base_tokens,
        "rows": rows,
    }


def format_study(study: dict) -> str:
    """A plain-text table of :func:`speculation_study`'s rows."""
    c = study["cost"]
    lines = [f"target step {c['target_step_s'] * 1e3:.2f} ms, draft step {c['draft_step_s'] * 1e3:.2f} ms, "
             f"c = {c['c']:.3f}; baseline {study['baseline']['tok_s']:.0f} tok/s end to end, "
             f"{study['baseline']['decode_s_per_token'] * 1e3:.2f} ms per decoded token; "
             f"{study['baseline']['whitespace_fraction']:.0%} of the output is whitespace",
             f"{'k':>2} {'accept':>7} {'a_hat':>6} {'tok/pass':>8} {'E(a,k)':>7} {'v':>5} "
             f"{'speedup':>8} {'decode':>7} {'S(v=1)':>7} {'S(v)':>6} {'c_in':>5} {'v_in':>5} {'S_acc':>6} "
             f"{'mlx-lm':>7} same"]
    for r in study["rows"]:
        lines.append(f"{r['k']:>2} {r['acceptance_rate']:7.3f} {r['a_hat']:6.3f} {r['tokens_per_pass']:8.2f} "
                     f"{r['tokens_per_pass_analytic']:7.2f} {r['v']:5.2f} {r['speedup']:8.3f} "
                     f"{r['speedup_decode']:7.3f} {r['speedup_analytic']:7.3f} {r['speedup_analytic_v']:6.3f} "
                     f"{r['c_in_loop']:5.2f} {r['v_in_loop']:5.2f} {r['speedup_accounting']:6.3f} "
                     f"{r.get('speedup_mlx_lm', float('nan')):7.3f} {r['identical']}")
    return "\n".join(lines)


# the verdicts live in mlxlab.studies.speculation.verdict; notebook 03, the CLI and users' scripts read them here too
from mlxlab.studies.speculation.verdict import decide_stored, verdicts  # noqa: E402,F401
