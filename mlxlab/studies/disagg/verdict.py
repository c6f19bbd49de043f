"""The disaggregation study's verdicts (issue 21), decided from a ``disagg.json``
(:func:`mlxlab.studies.disagg.run.run_study`, saved with its environment): ``mlx-disagg-exact``,
``mlx-disagg-chat-itl`` and ``mlx-disagg-sim`` (data/claims/mlxlab.yaml) and
``s001-own-compute`` (seed-001.yaml).

The first two read the measured runs only. The last two run the simulator (deterministic, no
device): the two-executor topology of :mod:`mlxlab.studies.disagg.sim` on the run's own workload,
scored against the measured repeats with the simulator validation's rule
(:func:`mlxlab.studies.sim_validation.scoring.score`), and the case study's scene at its own scale
(:mod:`mlxlab.studies.disagg.seed`), the KV moving over the transfer line fitted to the run's
measured sends. :func:`decide_stored` decides them again for a saved file (``mlxlab rescore``).
"""

from __future__ import annotations

import math
import statistics
from typing import Dict, List, Mapping, Optional

from mlxlab.core.claims import verdict

ITL_GAIN_X = 0.5  # the disaggregated chat ITL p99 over one engine's, at most (mlx-disagg-chat-itl)
SEED_ITL_X = 2.0  # the chat's ITL p99 over its solo ITL at the seed's scale, at most (s001-own-compute)
SIM_METRICS = ("chat_itl_p50_ms", "chat_itl_p99_ms", "doc_ttft_s", "doc_transfer_s")
#: the seed-scale settings the verdict compares: the case study's two fixes on one machine, and two machines
ONE_FIXED, TWO = "one machine, gate + prefix cache", "two machines + prefix cache"


def _vals(runs: List[Mapping], key: str) -> List[float]:
    return [float(r[key]) for r in runs if isinstance(r.get(key), (int, float)) and math.isfinite(float(r[key]))]


def _spread(xs: List[float]) -> Optional[dict]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)} if xs else None


def _r(x, nd: int = 3):
    return round(float(x), nd) if isinstance(x, (int, float)) and math.isfinite(float(x)) else None


def _machine(doc: Mapping) -> str:
    """The run's conditions in a sentence: cores, OpenBLAS threads per process, load averages."""
    cfg = doc.get("config") or {}
    loads = [x["loadavg"][0] for x in doc.get("load") or [] if x.get("loadavg")]
    load = f"one-minute load averages {min(loads):.1f}-{max(loads):.1f} before the runs" if loads else "load not recorded"
    return (f"{cfg.get('cpu_count', '?')} cores shared by both processes (and any other work: {load}), "
            f"{_threads(cfg)}, "
            f"{cfg.get('repeats', '?')} repeats alternating the settings, fresh processes each, the last of "
            f"{cfg.get('rounds', '?')} rounds measured")


def equal_threads(cfg: Mapping) -> Optional[bool]:
    """Whether the one engine held as many OpenBLAS threads as the two workers together (None:
    the file does not say)."""
    by = cfg.get("openblas_threads_by_setting")
    if by:
        return by.get("single") == 2 * by.get("disagg", 0)
    per = cfg.get("openblas_threads_per_process")
    return None if per is None else False  # before threads_by_setting every process had the same count


def _threads(cfg: Mapping) -> str:
    """The threads each side held, in words, from the run's config."""
    by = cfg.get("openblas_threads_by_setting")
    if by and equal_threads(cfg):
        return (f"the same OpenBLAS threads in total on each side: {by['single']} for the one engine, "
                f"{by['disagg']} for each of the two workers")
    per = (by or {}).get("disagg", cfg.get("openblas_threads_per_process", "?"))
    return (f"unequal threads: {per} OpenBLAS thread(s) in every process, so the two workers held twice the one "
            f"engine's (on a 2-core host, part of the split's gain is the second core)")


def exact_verdict(doc: Mapping) -> Dict:
    """``mlx-disagg-exact``: reproduced when every disaggregated run's document tokens equal the
    single engine's and the chat's agree over the tokens both runs produced (the chat is cancelled
    on a clock, so its length differs). Runs without stored tokens: not measured."""
    runs = doc.get("runs") or {}
    singles = [r["output_tokens"] for r in runs.get("single", []) if r.get("output_tokens")]
    splits = [(name, i, r["output_tokens"]) for name, rs in runs.items() if name != "single"
              for i, r in enumerate(rs) if r.get("output_tokens")]
    rule = ("Every disaggregated run (each setting and repeat) against the single engine's runs on the same "
            "workload: the document's greedy tokens must be equal, and the chat's over the shorter of the two "
            "streams (the chat is cancelled a few tokens after the document is done, which comes at another "
            "point of its stream on each side). Reproduced when every comparison agrees; any difference is not "
            "reproduced (first_difference: where the chat parted).")
    fair = ("The two sides decode the same rows in batches of another composition (the document joins the chat's "
            "batch at another of its tokens), so on a GPU dtype a near-tie of the two best logits may flip a token "
            "by rounding; these runs are float32. tests/test_disagg.py also checks both sides against mlx-lm's "
            "generate_step on tiny.")
    if not singles or not splits:
        return verdict("mlx-disagg-exact", "not measured", measured=None,
                       rule="This file's runs store no tokens (they were measured before the study kept them). " + rule,
                       fairness=fair)
    ref = singles[0]  # the other single-engine repeats are compared with it too
    pairs = [("single", i, s) for i, s in enumerate(singles[1:], 1)] + splits
    compared, differ = [], []
    for name, i, toks in pairs:
        n = min(len(toks["chat"]), len(ref["chat"]))
        at = next((k for k in range(n) if toks["chat"][k] != ref["chat"][k]), None)
        compared.append(n)
        if at is not None or toks["doc"] != ref["doc"]:
            differ.append({"run": f"{name}:{i}", "chat_index": at, "doc_equal": toks["doc"] == ref["doc"]})
    first = min(differ, key=lambda d: math.inf if d["chat_index"] is None else d["chat_index"], default=None)
    measured = {"runs_equal": len(pairs) - len(differ), "runs_compared": len(pairs),
                "chat_tokens_compared_min": min(compared), "doc_tokens": len(ref["doc"]), "first_difference": first}
    return verdict("mlx-disagg-exact", "not reproduced" if differ else "reproduced",
                   measured=measured, rule=rule, fairness=fair)


def chat_itl_verdict(doc: Mapping) -> Dict:
    """``mlx-disagg-chat-itl``: reproduced when the disaggregated runs' chat ITL p99 over the
    document's prefill window is at most ITL_GAIN_X one engine's (median of the paired repeats)
    and below it in every repeat (every disaggregated run under every single-engine run: beyond the
    repeats' spread). Measured beside it: the document's TTFT on both sides."""
    runs = doc.get("runs") or {}
    one, two = runs.get("single") or [], runs.get("disagg") or []
    rule = (f"The chat's ITL p99 over its gaps overlapping the document's prefill (arrival to first token), per "
            f"repeat, on one engine and with the prefill worker in a second process (setting 'disagg'). Reproduced "
            f"when the median of the paired ratios (repeat r disaggregated over repeat r single) is at most "
            f"{ITL_GAIN_X:g} and every disaggregated repeat is below every single-engine repeat; the document's "
            f"TTFT is measured beside it, not decided.")
    if not one or not two:
        return verdict("mlx-disagg-chat-itl", "not measured", measured=None, rule=rule,
                       fairness="The file holds no single-engine or no disaggregated runs.")
    p99_1, p99_2 = _vals(one, "chat_itl_p99_ms"), _vals(two, "chat_itl_p99_ms")
    ttft_1, ttft_2 = _vals(one, "doc_ttft_s"), _vals(two, "doc_ttft_s")
    paired = [b / a for a, b in zip(p99_1, p99_2) if a > 0]
    ratio = statistics.median(paired) if paired else float("nan")
    separated = bool(p99_1 and p99_2) and max(p99_2) < min(p99_1)
    ttft_ratio = statistics.median([b / a for a, b in zip(ttft_1, ttft_2) if a > 0]) if ttft_1 and ttft_2 else None
    measured = {"itl_p99_ratio_x": _r(ratio), "separated": separated,
                "single_chat_itl_p99_ms": _spread(p99_1), "disagg_chat_itl_p99_ms": _spread(p99_2),
                "single_doc_ttft_s": _spread(ttft_1), "disagg_doc_ttft_s": _spread(ttft_2),
                "doc_ttft_ratio_x": _r(ttft_ratio), "paired_itl_p99_ratios": [_r(x) for x in paired],
                "before_doc_itl_p50_ms": {k: _spread(_vals(runs.get(k) or [], "chat_itl_before_doc_p50_ms"))
                                          for k in ("single", "disagg")}}
    if runs.get("disagg-busywait"):
        measured["busywait_chat_itl_p99_ms"] = _spread(_vals(runs["disagg-busywait"], "chat_itl_p99_ms"))
    cpu = {k: _r(statistics.median(_vals(runs[k], "cpu_s_total")), 2) if _vals(runs[k], "cpu_s_total") else None
           for k in ("single", "disagg")}
    loads = [x["loadavg"][0] for x in doc.get("load") or [] if x.get("loadavg")]
    measured.update(cpu_s_median=cpu, load_1min=[_r(min(loads), 2), _r(max(loads), 2)] if loads else None)
    ok = math.isfinite(ratio) and ratio <= ITL_GAIN_X and separated
    return verdict(
        "mlx-disagg-chat-itl", "reproduced" if ok else "not reproduced", measured=measured, rule=rule,
        fairness=f"The same workload (random prompt ids, one seed) and model preset on both sides, launched alike. "
                 f"{_machine(doc)}. Two processes on one host are not two machines: the prefill worker's compute "
                 f"competes with the decode worker's for the same cores, so the document's TTFT measures the shared "
                 f"cores' wall time (CPU seconds per run, median: one engine {cpu['single']}, the two processes "
                 f"{cpu['disagg']}).")


def profile_grid(config: Mapping, repeats: int = 2) -> dict:
    """:func:`mlxlab.sim.measure.profile_device`'s grid for a run of this study without a committed
    profile (the notebook measures one, a few seconds on ``tiny``): the run's chunk and a quarter of
    it after no context and after most of the document, decodes of one and two rows at the chat's
    and the document's context. Store the fitted model as the results' ``profile`` (:func:`sim_verdict`
    reads it)."""
    c, doc, chat = int(config["chunk_size"]), int(config["doc_tokens"]), int(config["chat_context"])
    return {"prefill_tokens": (max(1, c // 4), c), "contexts": (0, max(c, doc - c)), "decode_batches": (1, 2),
            "decode_contexts": (chat, doc), "repeats": repeats, "fill_chunk": c}


def _profile(doc: Mapping, platform: Optional[str]):
    """The cost model the topology is scored on: the one the run stored (``profile``), else the
    committed ``data/profiles/<platform>-<model>.json``; (cost model or None, its name)."""
    from mlxlab.sim.profiles import cost_model_from_dict, profiles_dir

    stored = doc.get("profile")
    if stored and stored.get("cost_model"):
        return cost_model_from_dict(stored), stored.get("name") or "stored in this file"
    plat = platform or (doc.get("environment") or {}).get("platform")
    name = f"{plat}-{(doc.get('config') or {}).get('model')}"
    path = profiles_dir() / f"{name}.json"
    if not path.is_file():
        return None, name
    from mlxlab.sim.profiles import load_profile

    return load_profile(path), name


def sim_verdict(doc: Mapping, *, platform: Optional[str] = None, simulated: Optional[Mapping] = None) -> Dict:
    """``mlx-disagg-sim``: the disaggregated setting's figures simulated
    (:func:`mlxlab.studies.disagg.sim.validate` on the run's profile, ``simulated`` if given)
    against the measured repeats, each metric under :func:`mlxlab.studies.sim_validation.scoring.score`'s
    rule; reproduced when every metric passes. Measured beside it: the single engine's errors on
    the same profile (how far the profile itself holds on this run)."""
    from mlxlab.studies.sim_validation.scoring import MIN_TOLERANCE, NOISE_FACTOR, score

    rule = (f"Per metric of the disaggregated setting ({', '.join(SIM_METRICS)}): error = |simulated - measured "
            f"median| / measured median, noise = the repeats' coefficient of variation, passed when error <= "
            f"max({MIN_TOLERANCE:.0%}, {NOISE_FACTOR:g} x noise) (the simulator validation's rule). The simulator runs "
            f"the run's workload on the platform's profile for the model, with the KV transfer line fitted to the "
            f"run's own sends. Reproduced when every metric passes; the single engine's errors are reported beside.")
    runs = doc.get("runs") or {}
    if not runs.get("disagg") or not runs.get("single"):
        return verdict("mlx-disagg-sim", "not measured", measured=None, rule=rule,
                       fairness="The file holds no single-engine or no disaggregated runs.")
    if simulated is None:
        cm, name = _profile(doc, platform)
        if cm is None:
            return verdict("mlx-disagg-sim", "not measured", measured={"profile": name}, rule=rule,
                           fairness=f"No profile {name} (mlxlab profile --model ... --save) and none stored in the file.")
        from mlxlab.studies.disagg.sim import validate

        simulated = {**validate(doc, profile=cm), "profile_name": name}
    rows, errors = {}, {}
    for setting, keys in (("disagg", SIM_METRICS), ("single", SIM_METRICS[:3])):
        for k in keys:
            s = score(_vals(runs[setting], k), [simulated["settings"][setting][k]["simulated"]])
            if s is None:
                continue
            if setting == "disagg":
                rows[k] = {"error": _r(s["rel_error"]), "tolerance": _r(s["tolerance"]), "passed": s["passed"],
                           "simulated": _r(s["sim"], 4), "measured": _r(s["engine"], 4)}
            else:
                errors[k] = _r(s["rel_error"])
    sim_bytes = simulated["settings"]["disagg"].get("doc_kv_bytes", {}).get("simulated")
    measured = {"passed": sum(r["passed"] for r in rows.values()), "metrics": len(rows),
                "worst_error": max((r["error"] for r in rows.values() if r["error"] is not None), default=None),
                "disagg": rows, "single_errors": errors, "profile": simulated.get("profile_name"),
                "transfer_fit": simulated.get("transfer_fit"),
                "kv_bytes_equal": sim_bytes == (doc.get("summary") or {}).get("disagg", {}).get("doc_kv_bytes", {}).get("median")}
    ok = bool(rows) and len(rows) == len(SIM_METRICS) and all(r["passed"] for r in rows.values())
    return verdict(
        "mlx-disagg-sim", "reproduced" if ok else "not reproduced", measured=measured, rule=rule,
        fairness=f"The profile's costs are a quiet single process's; the measured runs are two processes on shared "
                 f"cores ({_machine(doc)}), which the cost model does not see: when the single engine's errors are "
                 f"as large, the profile does not hold on this run, not the topology.")


def seed_verdict(doc: Mapping, *, seed: Optional[Mapping] = None) -> Dict:
    """``s001-own-compute`` at the case study's scale (:func:`mlxlab.studies.disagg.seed.seed_disagg_study`,
    ``seed`` if given, else run here with the transfer line fitted to the run's sends): reproduced
    when two machines keep the chat's ITL p99 within SEED_ITL_X of its solo ITL where the case
    study's two fixes on one machine do not, and the batch's last first token comes no later than
    under those fixes. Measured: every setting's chat ITL p99 and worst gap, warm-turn TTFT and
    batch completion."""
    rule = (f"The seed-scale scene on the published profile (a chat at the case study's context streaming when four "
            f"benchmark prompts and a warm session's next turn arrive), at its chunk of 2,048: '{TWO}' (a prefill "
            f"machine and a decode machine, the KV over the transfer line measured in this run) against '{ONE_FIXED}' "
            f"(the case study's two fixes on one machine). Reproduced when the chat's ITL p99 over the batch's "
            f"prefill window is at most {SEED_ITL_X:g}x its solo ITL with two machines and above it with the fixes, "
            f"and the batch's last first token comes no later with two machines; the warm turn's TTFT is reported "
            f"(what the prefix cache buys), not decided.")
    transfers = [t for r in (doc.get("runs") or {}).get("disagg") or [] for t in (r.get("transfers") or {}).values()
                 if t.get("transfer_s")]
    if seed is None:
        if not transfers:
            return verdict("s001-own-compute", "not measured", measured=None, rule=rule,
                           fairness="The file holds no disaggregated run with a measured KV transfer.",
                           source="simulation")
        from mlxlab.studies.disagg.seed import seed_disagg_study
        from mlxlab.studies.disagg.sim import fit_transfer

        seed = seed_disagg_study(fit_transfer(transfers))
    st, solo = seed["settings"], seed["solo_itl_ms"]
    two, one = st[TWO], st[ONE_FIXED]
    ok = (two["chat_itl_p99_ms"] <= SEED_ITL_X * solo < one["chat_itl_p99_ms"]
          and two["batch_last_first_token_s"] <= one["batch_last_first_token_s"])
    measured = {"two_machines_chat_itl_p99_ms": _r(two["chat_itl_p99_ms"], 2),
                "one_machine_fixes_chat_itl_p99_ms": _r(one["chat_itl_p99_ms"], 2), "solo_itl_ms": _r(solo, 2),
                "two_machines_batch_last_s": _r(two["batch_last_first_token_s"], 2),
                "one_machine_fixes_batch_last_s": _r(one["batch_last_first_token_s"], 2),
                "warm_turn_ttft_s": {k: _r(v["warm_turn_ttft_s"], 2) for k, v in st.items()},
                "settings": {k: {m: _r(v[m], 3) for m in ("chat_itl_p50_ms", "chat_itl_p99_ms", "chat_worst_gap_ms",
                                                          "warm_turn_ttft_s", "batch_ttft_p50_s",
                                                          "batch_last_first_token_s")} for k, v in st.items()},
                "transfer": {k: seed["transfer"][k] for k in ("latency_s", "s_per_byte")},
                "kv_bytes_per_token": seed["kv_bytes_per_token"],
                "scene": {k: seed["scene"][k] for k in ("chat_context_tokens", "batch_prompt_tokens", "chunk_size",
                                                         "turn_tokens", "window_s")}}
    return verdict(
        "s001-own-compute", "reproduced" if ok else "not reproduced", measured=measured, rule=rule,
        fairness="A simulation of the case study's machine (derived from its published figures), not a measurement: "
                 "the second machine is the same M4 Max again, so two machines have twice one's compute (the case "
                 "study's 'budget permitting'). The transfer line is this run's loopback ring on this host, slower "
                 "than a fast link between two machines would be, and the decode machine is charged nothing for "
                 "receiving; a prefix-cache restore is charged nothing either.", source="simulation")


def verdicts(doc: Mapping, *, platform: Optional[str] = None, simulated: Optional[Mapping] = None,
             seed: Optional[Mapping] = None) -> List[Dict]:
    """The four verdicts from a ``disagg.json`` document (or :func:`run_study`'s result with
    ``platform``); ``simulated`` / ``seed``: the simulations if already run."""
    return [exact_verdict(doc), chat_itl_verdict(doc), sim_verdict(doc, platform=platform, simulated=simulated),
            seed_verdict(doc, seed=seed)]


def decide_stored(doc: Mapping, path=None) -> List[Dict]:
    """The verdicts of a saved ``disagg.json`` (:class:`~mlxlab.studies.base.Study`'s ``decide``;
    nothing is measured: the simulations run again on the stored runs)."""
    if "runs" not in doc:
        raise ValueError(f"{path or 'this document'} is not a disaggregation result (no runs)")
    return verdicts(doc)
