"""Greedy speculative decoding for one stream, its analytic model, and a measured study.

A draft model proposes ``k`` tokens one at a time; the target scores the last accepted token
plus the ``k`` proposals in one pass and keeps the longest prefix on which its own greedy choice
agrees, plus one token of its own (the correction, or a bonus token when all ``k`` agree). The
output is token-for-token the target's greedy output; only the number of target passes changes.

Analytic model (each draft token accepted independently with probability ``a``; a draft step
costs ``c`` target decode steps; the verification pass of ``k + 1`` tokens costs ``v`` target
steps, ``v = 1`` in the textbook model)::

    tokens per target pass  E(a, k) = (1 - a**(k + 1)) / (1 - a)
    speedup                 S(a, k, c, v) = E(a, k) / (k * c + v)

Functions here measure every quantity in it: ``a`` and tokens per pass from the accept/reject
record of real runs, ``c`` and ``v`` from timed decode steps and verification passes of the
two models, and the end-to-end speedup against mlx-lm's target-alone ``generate_step``.
"""

from __future__ import annotations

import statistics
import time
from typing import Dict, Iterable, List, Optional, Sequence

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

from mlxlab.core.presets import module_of

DEFAULT_KS = (1, 2, 3, 4, 6, 8)


# --------------------------------------------------------------------------- analytic model


def expected_tokens_per_pass(a: float, k: int) -> float:
    """Expected tokens produced per target pass with ``k`` drafts accepted i.i.d. with prob. ``a``:
    ``(1 - a^(k+1)) / (1 - a)``; 1 at ``a = 0``, ``k + 1`` at ``a = 1``."""
    if not 0.0 <= a <= 1.0:
        raise ValueError(f"acceptance rate must be in [0, 1], got {a}")
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    if a == 1.0:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def analytic_speedup(a: float, k: int, c: float, v: float = 1.0) -> float:
    """Speedup of speculative over target-alone decoding:
    ``(1 - a^(k+1)) / ((1 - a) (k c + v))``, ``c`` = draft step / target step cost, ``v`` = cost
    of the (k+1)-token verification pass in target steps (1 in the textbook formula)."""
    return expected_tokens_per_pass(a, k) / (k * c + v)


def breakeven_cost_ratio(a: float, k: int, v: float = 1.0) -> float:
    """The draft cost ratio ``c`` below which speculation with ``k`` drafts pays (speedup > 1);
    negative when it cannot pay at any ``c``."""
    if k <= 0:
        raise ValueError("k must be >= 1")
    return (expected_tokens_per_pass(a, k) - v) / k


def best_k(a: float, c: float, ks: Iterable[int] = range(1, 17), v=1.0) -> tuple:
    """``(k, speedup)`` maximising :func:`analytic_speedup` over ``ks``; ``v`` a number or a
    function of ``k``. ``k = 0`` (no speculation, speedup 1) wins when nothing pays."""
    best = (0, 1.0)
    for k in ks:
        s = analytic_speedup(a, k, c, v(k) if callable(v) else v)
        if s > best[1]:
            best = (k, s)
    return best


def estimate_acceptance(rounds: Sequence[tuple]) -> float:
    """Maximum-likelihood per-token acceptance probability of the i.i.d. model from
    ``(k, n_accepted)`` rounds: each round tests drafts until the first rejection, so
    ``a = sum(n) / sum(n + [n < k])``. (accepted / proposed underestimates ``a``: drafts after a
    rejection are proposed but never tested.)"""
    acc = sum(n for k, n in rounds if k > 0)
    rej = sum(1 for k, n in rounds if k > 0 and n < k)
    return acc / (acc + rej) if acc + rej else float("nan")


# --------------------------------------------------------------------------- decoding


def _prefill(model, cache, tokens: List[int], step: int = 512) -> None:
    for i in range(0, len(tokens), step):
        model(mx.array(tokens[i:i + step], mx.uint32)[None], cache=cache)
        mx.eval([c.state for c in cache])


def speculative_generate(target, draft, prompt_tokens: Sequence[int], max_tokens: int = 128,
                         num_draft_tokens: int = 4, *, prefill_step_size: int = 512) -> dict:
    """Greedy speculative decoding of ``max_tokens`` tokens after ``prompt_tokens``.

    ``target`` / ``draft``: :class:`mlxlab.LoadedModel` or mlx-lm modules sharing a vocabulary.
    Each round the draft proposes ``k = min(num_draft_tokens, tokens still needed - 1)`` tokens,
    the target verifies them in one pass of ``k + 1`` tokens, and both KV caches are trimmed
    back to the accepted prefix (``trim_prompt_cache``). ``num_draft_tokens=0`` is plain greedy
    decoding, one target pass per token.

    Returns a dict: ``tokens`` (list, equal to the target's greedy output), ``accepted`` /
    ``proposed`` draft tokens, ``target_passes``, ``draft_steps`` (draft forward calls),
    ``rounds`` (list of ``(k, n_accepted)``), ``acceptance_rate`` (accepted / proposed), ``a_hat``
    (:func:`estimate_acceptance`), ``tokens_per_pass`` and ``times`` in seconds (``prefill``
    of both models, ``draft`` and ``verify`` summed over rounds, ``decode`` = everything after
    prefill, ``total``).
    """
    tm, dm = module_of(target), module_of(draft)
    prompt = [int(t) for t in prompt_tokens]
    if not prompt:
        raise ValueError("empty prompt")
    k_max = int(num_draft_tokens)
    if k_max < 0:
        raise ValueError("num_draft_tokens must be >= 0")
    t_start = time.perf_counter()
    tc = make_prompt_cache(tm)
    dc = make_prompt_cache(dm) if k_max > 0 else None
    _prefill(tm, tc, prompt[:-1], prefill_step_size)
    if dc is not None:
        _prefill(dm, dc, prompt[:-1], prefill_step_size)
    t_prefill = time.perf_counter()

    out: List[int] = []
    rounds: List[tuple] = []
    last = prompt[-1]        # newest token, not yet in the target cache
    pending = [last]         # tokens not yet in the draft cache
    draft_s = verify_s = 0.0
    draft_steps = 0
    while len(out) < max_tokens:
        k = min(k_max, max_tokens - len(out) - 1)
        t0 = time.perf_counter()
        if k > 0:
            x = mx.array(pending, mx.uint32)
            ds = []
            for _ in range(k):
                logits = dm(x[None], cache=dc)
                x = mx.argmax(logits[0, -1:, :], axis=-1).astype(mx.uint32)
                mx.async_eval(x)
                ds.append(x)
            draft_steps += k
            d_arr = mx.concatenate(ds)
            mx.eval(d_arr)
            v_in = mx.concatenate([mx.array([last], mx.uint32), d_arr])
        else:
            v_in = mx.array([last], mx.uint32)
        t1 = time.perf_counter()
        logits = tm(v_in[None], cache=tc)
        t_arr = mx.argmax(logits[0], axis=-1)
        mx.eval(t_arr)
        t2 = time.perf_counter()
        draft_s += t1 - t0
        verify_s += t2 - t1
        t = t_arr.tolist()
        d = d_arr.tolist() if k > 0 else []
        n = 0
        while n < k and t[n] == d[n]:
            n += 1
        out.extend(t[:n + 1])          # d[:n] == t[:n], then the target's own token
        rounds.append((k, n))
        if k - n:
            trim_prompt_cache(tc, k - n)
        if k > 0:
            if n < k:
                # the draft cache holds pending + d[:k-1]; keep pending + d[:n]
                trim_prompt_cache(dc, k - 1 - n)
                pending = [t[n]]
            else:
                pending = [d[-1], t[k]]
        else:
            pending = pending + [t[0]]
        last = t[n]
    t_end = time.perf_counter()
    accepted = sum(n for _, n in rounds)
    proposed = sum(k for k, _ in rounds)
    return {
        "tokens": out,
        "num_draft_tokens": k_max,
        "accepted": accepted,
        "proposed": proposed,
        "target_passes": len(rounds),
        "draft_steps": draft_steps,
        "rounds": rounds,
        "acceptance_rate": accepted / proposed if proposed else float("nan"),
        "a_hat": estimate_acceptance(rounds),
        "tokens_per_pass": len(out) / len(rounds) if rounds else float("nan"),
        "times": {"prefill": t_prefill - t_start, "draft": draft_s, "verify": verify_s,
                  "decode": t_end - t_prefill, "total": t_end - t_start},
    }


def target_generate(target, prompt_tokens: Sequence[int], max_tokens: int = 128) -> dict:
    """Target-alone greedy decoding with mlx-lm's ``generate_step`` (the baseline), timed:
    ``tokens``, ``times`` (``first`` = prompt processing + first token, ``decode`` = the other
    ``max_tokens - 1`` tokens, ``total``)."""
    from mlx_lm.generate import generate_step

    tm = module_of(target)
    t0 = time.perf_counter()
    t_first = None
    toks: List[int] = []
    for (tok, _), _i in zip(generate_step(mx.array(list(prompt_tokens), mx.uint32), tm,
                                          max_tokens=max_tokens), range(max_tokens)):
        toks.append(int(tok))
        if t_first is None:
            t_first = time.perf_counter()
    t_end = time.perf_counter()
    return {"tokens": toks, "times": {"first": t_first - t0, "decode": t_end - t_first,
                                      "total": t_end - t0}}


def mlx_lm_speculative(target, draft, prompt_tokens: Sequence[int], max_tokens: int = 128,
                       num_draft_tokens: int = 4) -> dict:
    """The same run through mlx-lm's ``speculative_generate_step`` (for comparison):
    ``tokens``, ``accepted`` (tokens flagged as from the draft), ``times``."""
    from mlx_lm.generate import speculative_generate_step

    t0 = time.perf_counter()
    toks, acc = [], 0
    for tok, _, from_draft in speculative_generate_step(
            mx.array(list(prompt_tokens), mx.uint32), module_of(target), module_of(draft),
            num_draft_tokens=num_draft_tokens, max_tokens=max_tokens):
        toks.append(int(tok))
        acc += bool(from_draft)
    return {"tokens": toks, "accepted": acc, "times": {"total": time.perf_counter() - t0}}


# --------------------------------------------------------------------------- measurement


def _median(xs):
    return statistics.median(xs) if xs else float("nan")


def _timed(fn) -> float:
    t0 = time.perf_counter()
    mx.eval(fn())
    return time.perf_counter() - t0


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
    _prefill(tm, tc, ctx)
    _prefill(dm, dc, ctx)
    x1 = mx.array([[32]], mx.uint32)
    xs = {k: mx.array([[32] * (k + 1)], mx.uint32) for k in ks}

    def one(model, cache, x):
        def f():
            return mx.argmax(model(x, cache=cache)[0], axis=-1)
        t = _timed(f)
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
    import numpy as np

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
        is_ws = np.isin(y, list(b" \t\n\r"))
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
    ws = set(b" \t\n\r")
    tot = sum(len(s) for s in seqs)
    return sum(1 for s in seqs for t in s if t in ws) / tot if tot else float("nan")


def speculation_study(target, draft, prompts: Sequence[Sequence[int]],
                      ks: Iterable[int] = DEFAULT_KS, *, max_tokens: int = 128, repeats: int = 3,
                      mlx_lm: bool = True, cost: Optional[dict] = None,
                      log=None) -> dict:
    """Measure speculative decoding of ``target`` with ``draft`` on ``prompts`` for each ``k``.

    For each repeat and prompt, in turn: the target alone (mlx-lm ``generate_step``), then
    :func:`speculative_generate` with each ``k`` (and, with ``mlx_lm``, mlx-lm's
    ``speculative_generate_step``); interleaving by prompt spreads a changing machine load over
    all methods. Each method's time is summed over prompts; reported values are medians over
    repeats. Per ``k``: acceptance rate (accepted / proposed), ``a_hat``
    (:func:`estimate_acceptance`), tokens per target pass measured and predicted
    (:func:`expected_tokens_per_pass` at ``a_hat``), end-to-end and decode-only speedup over the
    target alone, and the analytic speedup three ways: ``speedup_analytic`` with ``c`` from
    :func:`measure_cost_ratio` and ``v = 1`` (the textbook formula), ``speedup_analytic_v`` with
    the measured verification cost ``v[k]`` too, and ``speedup_accounting`` with ``c`` and ``v``
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

    fields = ("total", "decode", "draft", "verify", "mlx_lm_total")
    base = {"total": [], "decode": []}
    spec = {k: {f: [] for f in fields} for k in ks}
    base_tokens: List[Optional[List[int]]] = [None] * len(prompts)
    rounds: Dict[int, list] = {k: [] for k in ks}
    counts = {k: {"accepted": 0, "proposed": 0, "target_passes": 0, "draft_steps": 0, "tokens": 0} for k in ks}
    identical = {k: True for k in ks}
    identical_mlx_lm = {k: True for k in ks}
    mlx_lm_acc = {k: 0 for k in ks}
    for r in range(repeats):
        bt = {"total": 0.0, "decode": 0.0}
        st = {k: {f: 0.0 for f in fields} for k in ks}
        for i, p in enumerate(prompts):
            b = target_generate(target, p, max_tokens)
            bt["total"] += b["times"]["total"]
            bt["decode"] += b["times"]["decode"] * max_tokens / max(1, max_tokens - 1)
            if base_tokens[i] is None:
                base_tokens[i] = b["tokens"]
            for k in ks:
                x = speculative_generate(target, draft, p, max_tokens, k)
                for f in ("total", "decode", "draft", "verify"):
                    st[k][f] += x["times"][f]
                identical[k] &= x["tokens"] == base_tokens[i]
                if r == 0:
                    rounds[k] += x["rounds"]
                    c = counts[k]
                    c["accepted"] += x["accepted"]
                    c["proposed"] += x["proposed"]
                    c["target_passes"] += x["target_passes"]
                    c["draft_steps"] += x["draft_steps"]
                    c["tokens"] += len(x["tokens"])
                if mlx_lm:
                    m = mlx_lm_speculative(target, draft, p, max_tokens, k)
                    st[k]["mlx_lm_total"] += m["times"]["total"]
                    identical_mlx_lm[k] &= m["tokens"] == base_tokens[i]
                    if r == 0:
                        mlx_lm_acc[k] += m["accepted"]
        for f in base:
            base[f].append(bt[f])
        for k in ks:
            for f in fields:
                spec[k][f].append(st[k][f])

    b_tot, b_dec = _median(base["total"]), _median(base["decode"])
    n_tok = len(prompts) * max_tokens
    t_tok = b_dec / n_tok   # the baseline's decode time per token
    rows = []
    for k in ks:
        s, cnt = spec[k], counts[k]
        a = estimate_acceptance(rounds[k])
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
            "accept_hist": [sum(1 for kk, n in rounds[k] if kk == k and n == j) for j in range(k + 1)],
            "tokens_per_pass": cnt["tokens"] / cnt["target_passes"],
            "tokens_per_pass_analytic": E,
            "spec_s": sp_tot, "spec_decode_s": sp_dec,
            "spec_draft_s": _median(s["draft"]), "spec_verify_s": _median(s["verify"]),
            "speedup": b_tot / sp_tot,
            "speedup_decode": b_dec / sp_dec,
            "speedup_analytic": analytic_speedup(a, k, cost["c"]) if a == a else float("nan"),
            "speedup_analytic_v": analytic_speedup(a, k, cost["c"], v) if a == a and v == v else float("nan"),
            "v": v,
            "c_in_loop": c_in, "v_in_loop": v_in,
            "speedup_accounting": E / (k * c_in + v_in) if a == a else float("nan"),
            "identical": identical[k],
        }
        if mlx_lm:
            row.update({"mlx_lm_spec_s": _median(s["mlx_lm_total"]),
                        "speedup_mlx_lm": b_tot / _median(s["mlx_lm_total"]),
                        "mlx_lm_acceptance_rate": mlx_lm_acc[k] / cnt["proposed"] if cnt["proposed"] else float("nan"),
                        "identical_mlx_lm": identical_mlx_lm[k]})
        rows.append(row)
        say(f"  k={k}: a={row['acceptance_rate']:.3f} (a_hat {a:.3f}), tokens/pass "
            f"{row['tokens_per_pass']:.2f} (analytic {E:.2f}), speedup {row['speedup']:.3f} "
            f"(decode {row['speedup_decode']:.3f}; analytic {row['speedup_analytic']:.3f}, with v "
            f"{row['speedup_analytic_v']:.3f}, in-loop accounting {row['speedup_accounting']:.3f}), "
            f"identical {row['identical']}")
    return {
        "config": {"ks": ks, "max_tokens": max_tokens, "repeats": repeats, "num_prompts": len(prompts),
                   "prompt_lengths": [len(p) for p in prompts]},
        "cost": cost,
        "baseline": {"total_s": b_tot, "decode_s": b_dec, "tok_s": n_tok / b_tot,
                     "decode_tok_s": n_tok / b_dec, "decode_s_per_token": t_tok,
                     "whitespace_fraction": _whitespace_fraction(base_tokens),
                     "method": "mlx_lm.generate.generate_step (greedy)"},
        "outputs": base_tokens,
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


# --------------------------------------------------------------------------- CLI


def add_speculate_arguments(parser) -> None:
    """Arguments of a ``speculation`` benchmark command (the lead wires this into cli.py)."""
    parser.add_argument("--target", default=None, help="model directory (default: data/weights/byte-target)")
    parser.add_argument("--draft", default=None, help="model directory (default: data/weights/byte-draft)")
    parser.add_argument("--ks", type=int, nargs="+", default=list(DEFAULT_KS))
    parser.add_argument("--prompts", type=int, default=16, help="held-out code prompts")
    parser.add_argument("--prompt-len", type=int, default=96,
                        help="bytes per prompt (held-out code, ending mid-line)")
    parser.add_argument("--seed", type=int, default=1, help="prompt selection seed")
    parser.add_argument("--max-tokens", type=int, default=64,
                        help="prompt + max tokens should stay within the 256 bytes the models were trained on")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-mlx-lm", action="store_true", help="skip mlx-lm's speculative_generate_step")
    parser.add_argument("--platform", default=None, help="results folder name (default: detected)")
    parser.add_argument("--name", default="speculation", help="results file name")


def cli_speculate(args) -> int:
    from mlxlab.core.results import save_results
    from mlxlab.engine.models import load_model
    from mlxlab.train.tiny import (
        DRAFT_PRESET,
        TARGET_PRESET,
        build_corpus,
        heldout_prompts,
        weights_dir,
    )

    target = load_model(args.target or weights_dir() / TARGET_PRESET)
    draft = load_model(args.draft or weights_dir() / DRAFT_PRESET)
    held = build_corpus(verify=False)["heldout"]
    prompts = heldout_prompts(args.prompts, length=args.prompt_len, seed=args.seed, data=held, midline=True)
    study = speculation_study(target, draft, prompts, ks=args.ks, max_tokens=args.max_tokens,
                              repeats=args.repeats, mlx_lm=not args.no_mlx_lm,
                              log=lambda s: print(s, flush=True))
    study["teacher_forced"] = teacher_forced_agreement(target, draft, held, max_windows=128)
    print(f"teacher-forced greedy agreement on held-out code: {study['teacher_forced']['agreement']:.3f}")
    study["models"] = {"target": target.name, "draft": draft.name,
                       "target_params": target.num_params, "draft_params": draft.num_params}
    print(format_study(study))
    path = save_results(args.name, study, platform=args.platform)
    print(f"wrote {path}")
    return 0
