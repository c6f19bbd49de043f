"""Contention: a chat that keeps streaming while a long document prefills beside it (issue 16).

One chat request decodes; once it has produced :data:`WARM_TOKENS` tokens a document of
``doc_tokens`` tokens arrives (max_tokens 1). Each *setting* (an engine policy / chunk size /
overlap mode, or mlx-lm's own ``BatchGenerator`` through
:class:`mlxlab.engine.baseline.MlxLmExecutor`) runs this on the same model object in one process.
Per setting and run:

* ``together``: the chat's gaps that overlap the window [document arrival, document first token]
  (the *during prefill* gaps), the chat's tokens and tokens/s in that window, and the document's
  TTFT;
* ``alone``: the document alone on the same setting: its *alone TTFT*.

And once per repeat, ``solo``: the chat alone on an interleave engine, whose steady-state gaps
(after its first :data:`WARM_TOKENS` tokens, as in ``together``) are the reference for the chat's
ITL. The repeats are outermost and the settings run in the given order within each, so drift in the
machine hits all of them alike. Run 1 of a setting is its first use in the process (its *first
run*: ``together`` before ``alone``); runs 2.. are *warm*: the warm figures are medians over the
warm runs, the ITL percentiles are over their pooled gaps. The document's TTFT is compared with its
alone TTFT on the same setting and with the best alone TTFT of any setting (so a setting cannot
look good by being slow alone). The solo reference pools the warm repeats' gaps too.

Warm-up (:class:`mlxlab.Engine`'s, before its clock starts; its seconds in ``warmup_s``): the first
engine of each setting (run 1's ``together``) and the first solo engine are built with ``warmup``,
the first of a setting with ``warmup_tokens`` = ``doc_tokens``, so a "policy" warm-up prefills a
document as long as the real one beside a chat and meets every chunk shape and context first.
Later engines of a setting start warm in the process and get no warm-up, except those of a policy
that learns from step records (``slo``), which get the default warm-up so each starts with a cost
model measured in its own warm-up rather than crawling up from its smallest chunk.
``BatchGenerator`` has no warm-up beyond what the process already ran.

Importing this module loads no MLX (the CLI lists :data:`SETTINGS` while it builds its parser);
the executors are imported when a run starts. The verdicts are in
:mod:`mlxlab.studies.contention.verdict`, the figure in :mod:`mlxlab.studies.contention.charts`.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Dict, List, Mapping, Sequence, Union

import numpy as np

WARM_TOKENS = 8  # chat tokens produced before the document arrives
AFTER_TOKENS = 2  # chat tokens after the document's first token, so the window's last gap closes
SOLO_TOKENS = 64  # the solo chat's steady-state tokens (after WARM_TOKENS)
SOLO_CHUNK = 2048  # the solo engine's chunk size (its prompt fits one chunk)


def _spec(name: str, executor: str = "engine", policy: str = "interleave", chunk_size: int = 2048,
          overlap=False, overlap_sync="layer", overlap_pace_x=None, overlap_job_chunks=1,
          compile_decode=False, **policy_options) -> dict:
    """A setting. ``overlap``, ``overlap_sync`` and ``overlap_job_chunks`` None leave them to the
    engine and its policy (``Engine(overlap=None)``); what it ran is in each row's ``ran_as``.
    ``compile_decode``: the engine's compiled decode step (the chat's steps that run alone)."""
    return {"name": name, "executor": executor, "policy": policy, "chunk_size": chunk_size, "overlap": overlap,
            "overlap_sync": overlap_sync, "overlap_pace_x": overlap_pace_x, "overlap_job_chunks": overlap_job_chunks,
            "compile_decode": compile_decode, "policy_options": policy_options}


#: label -> setting: ``name`` (for people), ``executor`` ("engine" or "mlx_lm"), ``policy``,
#: ``chunk_size``, ``overlap``, ``overlap_sync``, ``overlap_pace_x``, ``policy_options``
SETTINGS: Dict[str, dict] = {
    "mlx_lm-2048": _spec("mlx-lm BatchGenerator, step 2048", "mlx_lm", "mlx_lm.BatchGenerator"),
    "interleave-512": _spec("interleave, chunk 512", chunk_size=512),
    "interleave-2048": _spec("interleave, chunk 2048"),
    "stall_free-256": _spec("stall-free, budget 256", policy="stall_free", token_budget=256),
    "stall_free-512": _spec("stall-free, budget 512", policy="stall_free", token_budget=512),
    "stall_free-1024": _spec("stall-free, budget 1024", policy="stall_free", token_budget=1024),
    "overlap-256": _spec("overlap, chunk 256", chunk_size=256, overlap=True),
    "overlap-512": _spec("overlap, chunk 512", chunk_size=512, overlap=True),
    "overlap-2048": _spec("overlap, chunk 2048", overlap=True),
    "overlap-512-pipelined": _spec("overlap, chunk 512, layers pipelined", chunk_size=512, overlap=True,
                                   overlap_sync="pipelined"),
    "overlap-2048-pipelined": _spec("overlap, chunk 2048, layers pipelined", overlap=True, overlap_sync="pipelined"),
    "overlap-2048-jobs4": _spec("overlap, chunk 2048, 4 chunks a hand-over", overlap=True, overlap_job_chunks=4),
    "overlap-2048-pace1.6": _spec("overlap, chunk 2048, decode paced at 1.6x its gap", overlap=True,
                                  overlap_pace_x=1.6),
    "overlap-2048-pipelined-pace1.6": _spec("overlap, chunk 2048, layers pipelined, decode paced at 1.6x",
                                            overlap=True, overlap_sync="pipelined", overlap_pace_x=1.6),
    "overlap-2048-pipelined-jobs4": _spec("overlap, chunk 2048, layers pipelined, 4 chunks a hand-over", overlap=True,
                                          overlap_sync="pipelined", overlap_job_chunks=4),
    "overlap-2048-pipelined-jobs16": _spec("overlap, chunk 2048, layers pipelined, 16 chunks a hand-over",
                                           overlap=True, overlap_sync="pipelined", overlap_job_chunks=16),
    "overlap-2048-jobs16": _spec("overlap, chunk 2048, 16 chunks a hand-over", overlap=True, overlap_job_chunks=16),
    "overlap-4096-pipelined-jobs8": _spec("overlap, chunk 4096, layers pipelined, 8 chunks a hand-over", chunk_size=4096,
                                          overlap=True, overlap_sync="pipelined", overlap_job_chunks=8),
    "overlap-8192-pipelined-jobs4": _spec("overlap, chunk 8192, layers pipelined, 4 chunks a hand-over", chunk_size=8192,
                                          overlap=True, overlap_sync="pipelined", overlap_job_chunks=4),
    "overlap-2048-pipelined-jobs4-pace1.6": _spec("overlap, chunk 2048, pipelined, 4 chunks a hand-over, paced 1.6x",
                                                  overlap=True, overlap_sync="pipelined", overlap_job_chunks=4,
                                                  overlap_pace_x=1.6),
    "overlap-2048-pipelined-jobs4-pace2.2": _spec("overlap, chunk 2048, pipelined, 4 chunks a hand-over, paced 2.2x",
                                                  overlap=True, overlap_sync="pipelined", overlap_job_chunks=4,
                                                  overlap_pace_x=2.2),
    "slo-overlap": _spec("slo (defaults) on an overlap engine", policy="slo", overlap=True),
    "slo": _spec("slo (defaults)", policy="slo", overlap=None, overlap_sync=None, overlap_job_chunks=None),
    "admission_gate": _spec("admission gate (defaults)", policy="admission_gate"),
    # the compiled decode step (issue 35): the chat's cadence where its step runs alone
    "interleave-2048-compiled": _spec("interleave, chunk 2048, compiled decode step", compile_decode=True),
    "slo-compiled": _spec("slo (defaults), compiled decode step", policy="slo", overlap=None, overlap_sync=None,
                          overlap_job_chunks=None, compile_decode=True),
}


def resolve_settings(settings: Union[None, Sequence[str], Mapping[str, dict]] = None) -> Dict[str, dict]:
    """label -> setting: every one of :data:`SETTINGS` (None), those labels (a sequence), or the
    given settings (a mapping label -> spec with the keys of :func:`_spec`'s result). Raises
    ValueError on an unknown label or an empty selection."""
    if settings is None:
        return dict(SETTINGS)
    if isinstance(settings, Mapping):
        out = {str(k): {**_spec(str(k)), **v} for k, v in settings.items()}
    else:
        bad = [s for s in settings if s not in SETTINGS]
        if bad:
            raise ValueError(f"unknown contention setting(s) {bad}; choose from {list(SETTINGS)}")
        out = {s: SETTINGS[s] for s in dict.fromkeys(settings)}
    if not out:
        raise ValueError("no contention settings to run")
    return out


def learns(spec: Mapping) -> bool:
    """Whether the setting's policy learns from step records (its engines are primed by a warm-up)."""
    from mlxlab.policies import POLICIES  # pure Python

    factory = POLICIES.get(spec["policy"])
    return bool(spec["executor"] == "engine" and factory is not None and factory.observes)


def make_executor(model, spec: Mapping, warmup: str, warmup_tokens=None):
    """The setting's executor on ``model``: an :class:`mlxlab.Engine` built with ``warmup`` (and
    ``warmup_tokens``), or mlx-lm's ``BatchGenerator`` (no warm-up) with ``prefill_step_size`` = the
    chunk size."""
    if spec["executor"] == "mlx_lm":
        from mlxlab.engine.baseline import MlxLmExecutor  # mlx: only when a run starts

        return MlxLmExecutor(model, prefill_step_size=int(spec["chunk_size"]))
    from mlxlab.engine.loop import Engine  # mlx, as above

    jobs = spec.get("overlap_job_chunks", 1)
    return Engine(model, policy=spec["policy"], chunk_size=int(spec["chunk_size"]),
                  overlap=None if spec.get("overlap", False) is None else bool(spec["overlap"]),
                  overlap_sync=spec.get("overlap_sync", "layer"), overlap_pace_x=spec.get("overlap_pace_x"),
                  overlap_job_chunks=None if jobs is None else int(jobs),
                  warmup=warmup, warmup_tokens=warmup_tokens, compile_decode=bool(spec.get("compile_decode", False)),
                  **dict(spec.get("policy_options") or {}))


def _warmup_s(ex) -> float:
    return float(sum((getattr(ex, "warmup_s", None) or {}).values()))


def ran_as(ex) -> dict:
    """The mode an engine ran in, once it chose (``overlap`` None leaves that to its policy)."""
    if not hasattr(ex, "overlap"):
        return {}
    return {"overlap": bool(ex.overlap), "overlap_sync": ex.overlap_sync if ex.overlap else None,
            "overlap_job_chunks": ex.overlap_job_chunks if ex.overlap else None, "fuse": bool(getattr(ex, "fuse", False))}


def solo(model, chat_prompt: List[int], warmup: str, chat_tokens: int = SOLO_TOKENS) -> dict:
    """The chat alone on an interleave engine: its steady-state gaps (s) and the warm-up seconds."""
    from mlxlab.engine.loop import Engine  # mlx: only when a run starts

    eng = Engine(model, policy="interleave", chunk_size=SOLO_CHUNK, warmup=warmup)
    chat = eng.submit(chat_prompt, WARM_TOKENS + chat_tokens)
    eng.run()
    return {"gaps": chat.itl_s[WARM_TOKENS - 1:], "warmup_s": _warmup_s(eng)}


def together(ex, chat_prompt: List[int], doc_prompt: List[int], max_chat: int) -> dict:
    """On a fresh executor ``ex``: the chat decodes; the document arrives once the chat has
    WARM_TOKENS tokens; step until the document's first token and AFTER_TOKENS more chat tokens.
    Returns the window's gaps (s), the chat's tokens and tokens/s in the window, the document's
    TTFT, the chat's worst gap anywhere and the executor's warm-up seconds."""
    with ex:
        chat = ex.submit(chat_prompt, max_chat)
        while len(chat.output_tokens) < WARM_TOKENS and ex.has_work:
            ex.step()
        t_doc = ex.now()
        doc = ex.submit(doc_prompt, 1)
        while ex.has_work:
            if doc.done and doc.token_times_s and \
                    sum(t > doc.token_times_s[0] for t in chat.token_times_s) >= AFTER_TOKENS:
                break
            ex.step()
        ex.flush()
    t_first = doc.token_times_s[0]
    tt = chat.token_times_s
    window = [b - a for a, b in zip(tt, tt[1:]) if b > t_doc and a < t_first]
    n_in = sum(t_doc < t <= t_first for t in tt)
    return {"gaps": window, "chat_tokens_in_window": n_in,
            "chat_tok_s": n_in / (t_first - t_doc) if t_first > t_doc else float("nan"),
            "ttft_s": doc.ttft_s, "warmup_s": _warmup_s(ex), "ran_as": ran_as(ex)}


def alone(ex, doc_prompt: List[int]) -> dict:
    """The document alone on a fresh executor ``ex``: its TTFT and the warm-up seconds."""
    with ex:
        doc = ex.submit(doc_prompt, 1)
        ex.run()
    return {"alone_ttft_s": doc.ttft_s, "warmup_s": _warmup_s(ex)}


# ----------------------------------------------------------------------------- summaries


def pct(values: Sequence[float], p: float) -> float:
    return float(np.percentile(values, p)) if len(values) else float("nan")


def _div(a, b) -> float:
    a, b = float("nan") if a is None else float(a), float("nan") if b is None else float(b)
    return a / b if math.isfinite(a) and math.isfinite(b) and b > 0 else float("nan")


def _median(xs) -> float:
    xs = [float(x) for x in xs if x is not None and math.isfinite(float(x))]
    return statistics.median(xs) if xs else float("nan")


def _ms(x) -> float:
    return 1e3 * x if x is not None and math.isfinite(x) else float("nan")


def solo_summary(runs: List[dict]) -> dict:
    """The solo reference over the warm repeats (runs 2..): ITL p50/p99/max pooled; every run's
    gaps in ms (rounded)."""
    gaps = [g for r in runs[1:] for g in r["gaps"]]
    return {"itl_p50_ms": _ms(pct(gaps, 50)), "itl_p99_ms": _ms(pct(gaps, 99)),
            "itl_max_ms": _ms(max(gaps) if gaps else float("nan")), "n": len(gaps),
            "warmup_s": runs[0]["warmup_s"] if runs else None,
            "gaps_ms": [[round(1e3 * g, 3) for g in r["gaps"]] for r in runs]}


def contention_metrics(runs: List[dict], solo_ref: Mapping, alone_ttft_s: float, best_alone_s: float) -> dict:
    """The chat's and the document's figures over ``runs`` (their gaps pooled; medians of the
    per-run TTFT and rates), against the solo reference, this setting's alone TTFT and the best."""
    gaps = [g for r in runs for g in r["gaps"]]
    p50, p99 = _ms(pct(gaps, 50)), _ms(pct(gaps, 99))
    ttft = _median(r["ttft_s"] for r in runs)
    return {"chat_itl_p50_ms": p50, "chat_itl_p99_ms": p99,
            "chat_itl_p50_over_solo": _div(p50, solo_ref["itl_p50_ms"]),
            "chat_itl_p99_over_solo": _div(p99, solo_ref["itl_p99_ms"]),
            "chat_worst_gap_ms": _ms(max(gaps) if gaps else float("nan")),
            "chat_tok_s_during_prefill": _median(r["chat_tok_s"] for r in runs),
            "chat_tokens_during_prefill": _median(r["chat_tokens_in_window"] for r in runs),
            "doc_ttft_s": ttft, "doc_ttft_over_alone": _div(ttft, alone_ttft_s),
            "doc_ttft_over_best_alone": _div(ttft, best_alone_s)}


def summarize(specs: Mapping[str, dict], raw: Mapping[str, List[dict]], solo_ref: Mapping) -> dict:
    """Per setting: the warm figures (runs 2..), ``first_run`` (run 1, its ratios against the warm
    alone TTFTs), ``alone_ttft_s`` (warm median), ``warmup_s`` (run 1's engines), and ``runs``
    (every run's TTFTs, window token counts, rates and gaps in ms)."""
    alone_s = {k: _median(r["alone_ttft_s"] for r in runs[1:]) for k, runs in raw.items()}
    finite = {k: v for k, v in alone_s.items() if math.isfinite(v)}
    best_label = min(finite, key=finite.get) if finite else None
    best = finite[best_label] if best_label else float("nan")
    out = {}
    for label, runs in raw.items():
        row = {**{k: v for k, v in specs[label].items()}, "label": label, "repeats": len(runs)}
        row.update(contention_metrics(runs[1:], solo_ref, alone_s[label], best))
        row["alone_ttft_s"] = alone_s[label]
        row["first_run"] = {**contention_metrics(runs[:1], solo_ref, alone_s[label], best),
                            "alone_ttft_s": runs[0]["alone_ttft_s"]}
        row["first_over_warm_itl_p99"] = _div(row["first_run"]["chat_itl_p99_ms"], row["chat_itl_p99_ms"])
        row["warmup_s"] = runs[0]["warmup_s"]
        row["ran_as"] = runs[0].get("ran_as", {})
        row["runs"] = [{"ttft_s": r["ttft_s"], "alone_ttft_s": r["alone_ttft_s"], "chat_tok_s": r["chat_tok_s"],
                        "chat_tokens_in_window": r["chat_tokens_in_window"], "warmup_s": r["warmup_s"],
                        "gaps_ms": [round(1e3 * g, 3) for g in r["gaps"]]} for r in runs]
        out[label] = row
    return {"settings": out, "best_alone_ttft_s": best, "best_alone_setting": best_label}


# ----------------------------------------------------------------------------- the run


def run_contention(model, *, doc_tokens: int, chat_context: int, repeats: int,
                   settings: Union[None, Sequence[str], Mapping[str, dict]] = None, warmup: str = "policy",
                   seed: int = 0, progress: bool = True, chat_tokens: int = SOLO_TOKENS) -> dict:
    """The contention benchmark on ``model``: ``repeats`` rounds (at least 2: run 1 is the first
    run, the rest warm), each the solo chat then, per setting in order, ``together`` and
    ``alone``. ``settings``: labels of :data:`SETTINGS` (default all) or a mapping label -> spec;
    ``warmup``: every engine's warm-up mode; ``chat_tokens``: the solo chat's measured tokens.
    Prompts are random ids (:func:`mlxlab.engine.warmup.random_prompt`, seeds ``seed`` and
    ``seed + 1``).

    Returns a JSON-ready dict: ``solo`` (:func:`solo_summary`), ``settings`` (label -> the figures
    of :func:`contention_metrics`, warm, with ``first_run``, ``alone_ttft_s``, ``warmup_s``,
    ``first_over_warm_itl_p99`` and ``runs``), ``best_alone_ttft_s`` / ``best_alone_setting``,
    ``config`` and ``wall_s``."""
    from mlxlab.core.presets import model_limits
    from mlxlab.engine.warmup import random_prompt  # mlx (through mlxlab.engine): only when a run starts

    if repeats < 2:
        raise ValueError(f"repeats must be at least 2 (run 1 is the first run, the rest are warm), got {repeats}")
    specs = resolve_settings(settings)
    vocab, max_context = model_limits(model)
    if chat_context + WARM_TOKENS + SOLO_TOKENS >= max_context or doc_tokens + 1 > max_context:
        raise ValueError(f"chat_context {chat_context} / doc_tokens {doc_tokens} do not fit the model's "
                         f"context of {max_context} tokens")
    chat_prompt = random_prompt(chat_context, vocab, seed)
    doc_prompt = random_prompt(doc_tokens, vocab, seed + 1)
    max_chat = min(1 << 20, int(max_context) - chat_context - 1)
    bar = None
    if progress:
        from tqdm.auto import tqdm  # notebook plumbing, optional

        bar = tqdm(total=repeats * (1 + 2 * len(specs)), desc="contention runs", leave=False)

    def tick(what: str) -> None:
        if bar is not None:
            bar.set_postfix_str(what)
            bar.update(1)

    t0 = time.perf_counter()
    solo_runs: List[dict] = []
    raw: Dict[str, List[dict]] = {k: [] for k in specs}
    try:
        for rep in range(repeats):
            solo_runs.append(solo(model, chat_prompt, warmup if rep == 0 else "off", chat_tokens))
            tick(f"{rep + 1}/{repeats} solo")
            for label, spec in specs.items():
                later = warmup if learns(spec) else "off"  # see "Warm-up" in the module docstring
                first = make_executor(model, spec, warmup, doc_tokens) if rep == 0 else make_executor(model, spec, later)
                run = together(first, chat_prompt, doc_prompt, max_chat)
                tick(f"{rep + 1}/{repeats} {label} together")
                a = alone(make_executor(model, spec, later), doc_prompt)
                run["alone_ttft_s"], run["warmup_s"] = a["alone_ttft_s"], run["warmup_s"] + a["warmup_s"]
                raw[label].append(run)
                tick(f"{rep + 1}/{repeats} {label} alone")
    finally:
        if bar is not None:
            bar.close()
    solo_ref = solo_summary(solo_runs)
    out = {"solo": solo_ref, **summarize(specs, raw, solo_ref)}
    out["config"] = {"doc_tokens": doc_tokens, "chat_context": chat_context, "chat_tokens": chat_tokens,
                     "repeats": repeats, "settings": list(specs), "warmup": warmup, "seed": seed,
                     "warm_tokens": WARM_TOKENS, "after_tokens": AFTER_TOKENS, "solo_chunk": SOLO_CHUNK}
    out["wall_s"] = time.perf_counter() - t0
    return out


def format_table(preset: str, res: Mapping) -> str:
    """One preset's result as a text table: warm figures, then the first run's beside them."""
    s = res["solo"]
    head = (f"{'setting':<17}{'p50 ms':>8}{'p99 ms':>8}{'p99 x':>7}{'worst':>8}{'tok/s':>7}{'TTFT s':>8}"
            f"{'alone s':>8}{'x alone':>8}{'x best':>7} |{'1st p99x':>9}{'1st/warm':>9}{'1st TTx':>8}{'warm-up':>8}")
    first = (f"{preset}: solo chat ITL p50 {s['itl_p50_ms']:.2f} ms, p99 {s['itl_p99_ms']:.2f} ms ({s['n']} gaps); "
             f"best alone TTFT {res['best_alone_ttft_s']:.3f} s ({res['best_alone_setting']})")
    lines = [first, head, "-" * len(head)]
    for label, r in res["settings"].items():
        f = r["first_run"]
        lines.append(f"{label:<17}{r['chat_itl_p50_ms']:>8.2f}{r['chat_itl_p99_ms']:>8.2f}"
                     f"{r['chat_itl_p99_over_solo']:>7.2f}{r['chat_worst_gap_ms']:>8.1f}"
                     f"{r['chat_tok_s_during_prefill']:>7.1f}{r['doc_ttft_s']:>8.3f}{r['alone_ttft_s']:>8.3f}"
                     f"{r['doc_ttft_over_alone']:>8.2f}{r['doc_ttft_over_best_alone']:>7.2f} |"
                     f"{f['chat_itl_p99_over_solo']:>9.2f}{r['first_over_warm_itl_p99']:>9.2f}"
                     f"{f['doc_ttft_over_best_alone']:>8.2f}{r['warmup_s'] or 0.0:>7.1f}s")
    lines.append("Chat ITL over its gaps overlapping the document's prefill (warm runs pooled); p99 x: over solo "
                 "p99; worst: the worst such gap (ms); tok/s: the chat's rate in that window; TTFT: the document's "
                 "(warm median); x alone / x best: over this setting's / the best setting's alone TTFT; 1st: the "
                 "first run (p99 x solo, p99 over the warm p99, TTFT x best); warm-up: run 1's engines' seconds.")
    return "\n".join(lines)
