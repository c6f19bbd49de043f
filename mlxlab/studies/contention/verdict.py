"""The contention benchmark's verdicts (no MLX, no device): ``mlx-contention-frontier``,
``mlx-slo-contention-defaults`` and ``mlx-first-run-warm`` (data/claims/mlxlab.yaml).

:func:`verdicts` reads :func:`mlxlab.studies.contention.run.run_contention` results by preset (or the
``presets`` of a saved ``contention.json``). Only *engine* settings (``executor == "engine"``)
can carry a claim; mlx-lm's ``BatchGenerator`` is measured beside them, and its alone TTFT
counts for the best alone TTFT the frontier compares with.
"""

from __future__ import annotations

import math
from typing import Dict, List, Mapping, Optional, Tuple

from mlxlab.core.claims import verdict
from mlxlab.studies.rules import as_float, bound_check, combine_outcomes, rounded, values_band

ITL_X = 2.0  # the chat's warm ITL p99 over its solo p99, at most
TTFT_X = 1.2  # the document's warm TTFT over the best alone TTFT of any setting, at most
FIRST_RUN_X = 1.2  # the first run's chat ITL p99 over the warm runs', at most

FAIR = ("Every setting runs on the same model object in one process, the repeats outermost and the settings in "
        "one order within each, so drift hits them alike; the chat's prompt and the document are the same random "
        "ids for all. Engines are built with the run's warm-up mode ({warmup}), mlx-lm's BatchGenerator with none "
        "beyond what the process already ran (the solo chat and the settings before it). Warm figures: runs 2..; "
        "the ITL p99 is over their pooled window gaps ({repeats} repeats), so few repeats leave it noisy.")


def _engine_rows(res: Mapping) -> Dict[str, Mapping]:
    return {k: s for k, s in (res.get("settings") or {}).items() if s.get("executor") == "engine"}


def _is_slo_default(s: Mapping) -> bool:
    return s.get("policy") == "slo" and not s.get("policy_options") and not s.get("compile_decode")


def _fairness(presets: Mapping[str, Mapping], extra: str = "") -> str:
    cfgs = [r.get("config") or {} for r in presets.values()]
    modes = sorted({str(c.get("warmup")) for c in cfgs}) or ["unknown"]
    reps = sorted({c.get("repeats") for c in cfgs if c.get("repeats") is not None})
    text = FAIR.format(warmup=", ".join(modes), repeats="/".join(map(str, reps)) or "?")
    return f"{text} {extra}" if extra else text


_RANK = {"reproduced": 0, "inconclusive": 1, "not reproduced": 2}


def _setting_outcome(s: Mapping, res: Mapping, itl: float, ttft: float) -> Tuple[dict, dict]:
    """Whether one setting meets both bounds, with the noise bands of its warm runs' own figures (each
    run's chat ITL p99 over the solo p99, its document TTFT over the best alone: 3 x MAD / sqrt(runs),
    :func:`~mlxlab.studies.rules.values_band`); without stored runs, decided on the figures alone."""
    import numpy as np  # numpy only: the verdicts stay free of MLX

    solo, best = as_float((res.get("solo") or {}).get("itl_p99_ms")), as_float(res.get("best_alone_ttft_s"))
    runs = [r for r in (s.get("runs") or [])[1:] if r.get("gaps_ms")]
    b_i, n_i = values_band([float(np.percentile(r["gaps_ms"], 99)) / solo for r in runs] if solo > 0 else [])
    b_t, n_t = values_band([as_float(r.get("ttft_s")) / best for r in runs] if best > 0 else [])
    out = combine_outcomes([bound_check(itl, ITL_X, b_i, n_i), bound_check(ttft, TTFT_X, b_t, n_t)])
    return out, {k: rounded(b, 3) for k, b in (("itl", b_i), ("ttft", b_t)) if b is not None}


def frontier_verdict(presets: Mapping[str, Mapping]) -> Dict:
    """Reproduced when on every preset with engine figures some engine setting has a warm
    ``chat_itl_p99_over_solo`` <= ITL_X and ``doc_ttft_over_best_alone`` <= TTFT_X beyond the noise band
    of its warm runs; inconclusive where no setting of a preset passes beyond its bands but one lies within
    them; not reproduced when on some preset every setting
    misses beyond its band. Measured per preset: the closest setting (smallest max(itl / ITL_X, ttft /
    TTFT_X)), its two figures and every setting that meets both; where runs were stored, its bands
    (``noise_band_x``), the preset's ``outcome`` and the settings the noise leaves open (``unresolved``)."""
    measured, missing, failing, outcomes = {}, [], [], {}
    for name, res in presets.items():
        engine = _engine_rows(res)
        rows = {k: (as_float(s.get("chat_itl_p99_over_solo")), as_float(s.get("doc_ttft_over_best_alone")))
                for k, s in engine.items()}
        rows = {k: v for k, v in rows.items() if all(math.isfinite(x) for x in v)}
        if not rows:
            missing.append(name)
            continue
        best = min(rows, key=lambda k: max(rows[k][0] / ITL_X, rows[k][1] / TTFT_X))
        passing = [k for k, (i, t) in rows.items() if i <= ITL_X and t <= TTFT_X]
        measured[name] = {"setting": best, "chat_itl_p99_over_solo": rounded(rows[best][0]),
                          "doc_ttft_over_best_alone": rounded(rows[best][1]), "passing": passing}
        if not passing:
            failing.append(name)
        per = {k: _setting_outcome(engine[k], res, *rows[k]) for k in rows}
        if any(bands for _, bands in per.values()):
            outcomes[name] = min((o["verdict"] for o, _ in per.values()), key=_RANK.get)
            measured[name].update(outcome=outcomes[name], noise_band_x=per[best][1])
            if outcomes[name] == "inconclusive":
                measured[name]["unresolved"] = sorted(k for k, (o, _) in per.items() if o["verdict"] == "inconclusive")
    if missing:
        measured["not_measured"] = missing
    v = "not measured" if len(missing) == len(presets) else ("not reproduced" if failing else "reproduced")
    if v != "not measured" and outcomes:  # presets without runs keep their plain outcome
        plain = {n: ("not reproduced" if n in failing else "reproduced") for n in measured if n != "not_measured"}
        v = max({**plain, **outcomes}.values(), key=_RANK.get)
    return verdict(
        "mlx-contention-frontier", v, measured=measured or None,
        rule=f"Per preset, over the engine settings: the chat's warm ITL p99 over the gaps overlapping the document's "
             f"prefill, over the solo chat's p99 (itl), and the document's warm median TTFT over the best warm alone "
             f"TTFT of any setting, mlx-lm's included (ttft; so a setting cannot pass by being slow alone). "
             f"Reproduced when every preset has a setting with itl <= {ITL_X:g} and ttft <= {TTFT_X:g}; measured: "
             f"per preset the closest setting (smallest max(itl / {ITL_X:g}, ttft / {TTFT_X:g})) and its figures. "
             f"Where the warm runs are stored, each setting's two figures carry the noise band of its runs' own "
             f"figures (3 x their median absolute deviation / sqrt(runs)): a preset whose best setting meets both "
             f"bounds beyond its bands passes, one where a setting's figures lie within their bands of the bounds "
             f"(and none passes beyond them) is inconclusive, and the verdict is the worst preset's.",
        fairness=_fairness(presets))


def _warm_values(s: Mapping) -> Tuple[List[float], List[float]]:
    """A setting's warm runs' (runs 2..) chat ITL p99s (ms, each over its own window gaps) and
    document TTFTs (s); without stored runs, its pooled figures as one run each."""
    import numpy as np  # numpy only: the verdicts stay free of MLX

    runs = [r for r in (s.get("runs") or [])[1:] if r.get("gaps_ms")]
    if not runs:
        return [as_float(s.get("chat_itl_p99_ms"))], [as_float(s.get("doc_ttft_s"))]
    return [float(np.percentile(r["gaps_ms"], 99)) for r in runs], [as_float(r.get("ttft_s")) for r in runs]


def _below(xs: List[float], ys: List[float]) -> bool:
    """Every value of ``xs`` below every value of ``ys``: lower beyond the runs' own spread."""
    xs, ys = [x for x in xs if math.isfinite(x)], [y for y in ys if math.isfinite(y)]
    return bool(xs and ys) and max(xs) < min(ys)


def _dominating(res: Mapping) -> Tuple[Optional[Mapping], List[str], List[str]]:
    """slo's row, the settings that dominate it beyond noise, and those with both pooled figures
    lower (which may be noise)."""
    rows = _engine_rows(res)
    slo = next((s for s in rows.values() if _is_slo_default(s)), None)
    if slo is None:
        return None, [], []
    itl, ttft = as_float(slo.get("chat_itl_p99_ms")), as_float(slo.get("doc_ttft_s"))
    slo_itl, slo_ttft = _warm_values(slo)
    others = {k: s for k, s in rows.items() if s.get("policy") != "slo"}
    lower = [k for k, s in others.items() if as_float(s.get("chat_itl_p99_ms")) < itl and as_float(s.get("doc_ttft_s")) < ttft]
    dom = [k for k in lower if _below(_warm_values(others[k])[0], slo_itl)
           and _below(_warm_values(others[k])[1], slo_ttft)]
    return slo, dom, lower


def slo_defaults_verdict(presets: Mapping[str, Mapping]) -> Dict:
    """Reproduced when on no preset a fixed (non-slo) engine setting dominates slo with no options:
    both its warm chat ITL p99 and its warm document TTFT lower, in every warm run, than slo's in
    any warm run (so not by noise: the runs of one configuration differ by up to 2x in ITL p99 on
    the H200). Measured: the dominating settings (``preset:label``), those whose pooled figures
    are both lower (``lower_pooled``) and slo's two ratios and what it ran as per preset."""
    dominating, lower, slo_figs = [], [], {}
    for name, res in presets.items():
        slo, dom, low = _dominating(res)
        if slo is None:
            continue
        slo_figs[name] = {"chat_itl_p99_over_solo": rounded(slo.get("chat_itl_p99_over_solo")),
                          "doc_ttft_over_best_alone": rounded(slo.get("doc_ttft_over_best_alone"))}
        if slo.get("ran_as"):
            slo_figs[name]["ran_as"] = dict(slo["ran_as"])
        dominating += [f"{name}:{k}" for k in dom]
        lower += [f"{name}:{k}" for k in low]
    v = "not measured" if not slo_figs else ("not reproduced" if dominating else
                                              "inconclusive" if lower else "reproduced")
    return verdict(
        "mlx-slo-contention-defaults", v,
        measured={"dominating": dominating, "count": len(dominating), "lower_pooled": lower,
                  "within_noise": bool(lower) and not dominating, "slo": slo_figs} if slo_figs else None,
        rule="Per preset, slo with no policy options against every other engine setting (interleave, stall_free, "
             "overlap, admission_gate at their fixed chunk sizes or budgets): a setting dominates slo when its chat "
             "ITL p99 (each warm run's window gaps) and its document TTFT are lower in every warm run than slo's in "
             "any warm run. Not reproduced when a setting dominates slo on a preset; inconclusive when none does but "
             "a setting is lower on both pooled figures (lower_pooled) with runs that overlap slo's (the repeats "
             "cannot tell whether slo is dominated); reproduced when no setting is lower on both.",
        fairness=_fairness(presets, "A setting whose runs overlap slo's on either figure does not dominate it: "
                                    "with two warm runs a side, that is the spread the repeats can resolve."))


def first_run_verdict(presets: Mapping[str, Mapping]) -> Dict:
    """Reproduced when for every engine setting on every preset the first run's chat ITL p99 over
    the warm runs' is at most FIRST_RUN_X. Measured: the worst ratio, its setting, that setting's
    warm-up seconds and the warm-up seconds of all settings' first runs."""
    ratios = []
    for name, res in presets.items():
        for k, s in _engine_rows(res).items():
            r = as_float((s.get("first_run") or {}).get("chat_itl_p99_ms")) / as_float(s.get("chat_itl_p99_ms"))
            if math.isfinite(r):
                ratios.append((r, f"{name}:{k}", as_float(s.get("warmup_s")), _warm_values(s)[0]))
    modes = sorted({str((r.get("config") or {}).get("warmup")) for r in presets.values()})
    extra = ("A setting's first run follows the solo chat and the settings before it in the first round, so the "
             "kernels it shares with them are compiled already; only what is its own (its chunk shapes, policy, "
             "overlap thread) meets the process cold, and that is what the warm-up has to cover.")
    if modes != ["policy"]:
        extra += f" The claim's condition is the 'policy' warm-up; this run used {', '.join(modes)}."
    measured = None
    if ratios:
        worst = max(ratios, key=lambda x: x[0])
        warm = [x for x in worst[3] if math.isfinite(x)]
        measured = {"worst_ratio": rounded(worst[0]), "setting": worst[1], "warmup_s": rounded(worst[2], 2),
                    "warm_run_p99_ms": [rounded(min(warm), 2), rounded(max(warm), 2)] if warm else None,
                    "warmup_s_total": rounded(sum(x[2] for x in ratios if math.isfinite(x[2])), 2),
                    "settings": len(ratios), "warmup": ", ".join(modes)}
    v = "not measured" if not ratios else ("reproduced" if worst[0] <= FIRST_RUN_X else "not reproduced")
    return verdict(
        "mlx-first-run-warm", v, measured=measured,
        rule=f"Per engine setting and preset: the chat's ITL p99 over the window gaps of run 1 (the setting's first "
             f"use in the process; its engines warmed up before their clocks started) over the p99 of the warm runs' "
             f"pooled gaps. Reproduced when every ratio is at most {FIRST_RUN_X:g}; measured: the worst ratio, its "
             f"setting and warm-up seconds (run 1's engines).",
        fairness=_fairness(presets, extra))


def verdicts(presets: Mapping[str, Mapping]) -> List[Dict]:
    """The three contention verdicts from results by preset name."""
    return [frontier_verdict(presets), slo_defaults_verdict(presets), first_run_verdict(presets)]


def decide_stored(doc: Mapping, path=None) -> List[Dict]:
    """The verdicts of a saved contention result (:class:`~mlxlab.studies.base.Study`'s ``decide``),
    from its stored runs; no run is repeated."""
    if "presets" not in doc:
        raise ValueError(f"{path or 'this document'} is not a contention result (no presets)")
    return verdicts(doc["presets"])
