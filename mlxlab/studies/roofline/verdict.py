"""The roofline notebook's verdicts on seed 001's bandwidth claims (no MLX).

A *point* is one machine's single-stream decode of one model beside its decode ceiling
(bandwidth / bytes of weights read per step): :func:`decode_point` builds this run's from what
the notebook measured, :func:`committed_points` the other platforms' from their committed
``bench_engine*.json`` (and ``roofline.json``) files, each with the commit it ran at.
:func:`roofline_verdicts` turns them, with the seed's own arithmetic (:func:`seed_arithmetic`),
into :func:`mlxlab.core.claims.verdict` records.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence

from mlxlab.core.claims import not_testable, verdict
from mlxlab.core.presets import available_presets, preset_config
from mlxlab.studies.roofline.run import (
    decode_ceiling_tok_s,
    decode_estimate,
    weight_bytes_per_decode_step,
)

#: "about" for a recomputed figure against the published one (the seed rounds 182 to ~180).
ARITHMETIC_TOL = 0.05
#: The seed's "about a third" and "about 65 x the ratio": a fraction or a rate within this factor.
FACTOR = 1.5
#: Config arithmetic against the bytes mlx-lm's cache holds: the two must agree this closely.
KV_TOL = 0.01

_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def seed_arithmetic(bandwidth_gb_s: float = 546, weight_gb: float = 3, decode_tok_s: float = 65,
                    kv_kb_per_token: float = 20, ssd_gb_s: float = 14) -> Dict[str, float]:
    """The seed's divisions redone: ceiling (bandwidth / weights), the measured fraction of it, the
    KV read at 23k and 130k tokens (GB) and the SSD-weights ceiling."""
    ceiling = bandwidth_gb_s / weight_gb
    return {"ceiling_tok_s": ceiling, "fraction": decode_tok_s / ceiling,
            "kv_gb_23k": kv_kb_per_token * 1e3 * 23_000 / 1e9, "kv_gb_130k": kv_kb_per_token * 1e3 * 130_000 / 1e9,
            "ssd_ceiling_tok_s": ssd_gb_s / weight_gb}


def _dtype_bytes(dtype: str) -> int:
    name = str(dtype).split(".")[-1]
    return _DTYPE_BYTES.get(name, 2)


def decode_point(*, platform: str, source: str, commit: Optional[str], preset: str, config: dict,
                 dtype: str, bits: Optional[int], bandwidth_gb_s: float, bandwidth_source: str,
                 decode_tok_s: float, decode_cv: Optional[float] = None,
                 bandwidth_cv: Optional[float] = None) -> dict:
    """One machine's decode against its ceiling: bytes of weights per step from the config at the
    model's dtype and bits, ceiling = bandwidth / those bytes, fraction = decode / ceiling."""
    w = weight_bytes_per_decode_step(config, bits=bits, dtype_bytes=_dtype_bytes(dtype))
    ceiling = decode_ceiling_tok_s(bandwidth_gb_s * 1e9, w)
    return {"platform": platform, "source": source, "commit": commit, "preset": preset,
            "dtype": str(dtype).split(".")[-1], "bits": bits, "weight_mb": w / 1e6,
            "bandwidth_gb_s": bandwidth_gb_s, "bandwidth_source": bandwidth_source, "decode_tok_s": decode_tok_s,
            "decode_cv": decode_cv, "bandwidth_cv": bandwidth_cv, "ceiling_tok_s": ceiling,
            "fraction": decode_tok_s / ceiling}


def _datasheet_gb_s(device_name: str, hardware: Sequence[Mapping]) -> Optional[float]:
    for r in hardware:
        if device_name and (r["name"] == device_name or r["name"].startswith(device_name + " ")):
            return float(r["bandwidth_gb_s"])
    return None


def committed_points(results_root: Path, hardware: Sequence[Mapping], *, exclude_platform: Optional[str] = None,
                     side: str = "mlx_lm") -> List[dict]:
    """Decode points of every platform but ``exclude_platform``: the point its committed
    ``roofline.json`` measured (``here``), and from its (non-quick) ``bench_engine*.json`` files
    mlx-lm's single-stream decode median (``side``) of each preset whose config is known, against
    that platform's measured copy rate if its ``roofline.json`` holds one, else the datasheet
    figure of its device in ``hardware`` (``data/hardware.csv``); a platform with neither is left out."""
    presets = set(available_presets())
    out = []
    for plat_dir in sorted(p for p in Path(results_root).iterdir() if p.is_dir()):
        if plat_dir.name == exclude_platform:
            continue
        measured_bw = None
        roof = plat_dir / "roofline.json"
        if roof.is_file():
            rd = json.loads(roof.read_text())
            measured_bw = (rd.get("bandwidth") or {}).get("gb_s")
            if isinstance(rd.get("here"), dict) and "fraction" in rd["here"]:  # a roofline run's own point
                out.append({**rd["here"], "platform": plat_dir.name, "source": roof.name,
                            "commit": rd.get("environment", {}).get("git_commit")})
        for f in sorted(plat_dir.glob("bench_engine*.json")):
            d = json.loads(f.read_text())
            env = d.get("environment", {})
            bw = measured_bw or _datasheet_gb_s(env.get("device_name", ""), hardware)
            if not bw:
                continue
            src = "measured copy kernel (roofline.json)" if measured_bw else "datasheet (data/hardware.csv)"
            for preset, r in d.get("presets", {}).items():
                m = r.get("model", {})
                if preset not in presets or side not in r.get("single_decode_tok_s", {}):
                    continue
                out.append(decode_point(platform=plat_dir.name, source=f.name, commit=env.get("git_commit"),
                                        preset=preset, config=preset_config(preset), dtype=m.get("dtype", ""),
                                        bits=m.get("bits"), bandwidth_gb_s=float(bw), bandwidth_source=src,
                                        decode_tok_s=float(r["single_decode_tok_s"][side]["median"])))
    return out


def hardware_estimates(hardware: Sequence[Mapping]) -> List[dict]:
    """The seed's hardware table recomputed: 65 tok/s x bandwidth / 546 GB/s for every row."""
    return [{"name": r["name"], "bandwidth_gb_s": r["bandwidth_gb_s"],
             "decode_estimate_tok_s": decode_estimate(r["bandwidth_gb_s"]), "source": r["source"]} for r in hardware]


def _describe(p: Mapping) -> str:
    return (f"{p['preset']} ({p['dtype']}, {p['bits'] or 'unquantized'}{'-bit' if p['bits'] else ''}, "
            f"{p['weight_mb']:.0f} MB of weights per step) on {p['platform']} at {p['bandwidth_gb_s']:.0f} GB/s "
            f"({p['bandwidth_source']})")


def place(x: float, lo: float, hi: float, spread: float) -> str:
    """Where a measured ``x`` with relative ``spread`` sits against [lo, hi]: "inside" (its median
    is), "outside" (further out than 3 x spread), else "unclear" (outside, within the noise)."""
    if lo <= x <= hi:
        return "inside"
    return "unclear" if x * (1 - 3 * spread) <= hi and x * (1 + 3 * spread) >= lo else "outside"


_BY_PLACE = {"inside": "reproduced", "outside": "not reproduced", "unclear": "inconclusive"}


def robust_cv(xs: Sequence[float]) -> Optional[float]:
    """1.4826 x the median absolute deviation over the median (the CV a normal spread would have),
    so one outlying timing does not widen the band the way a standard deviation does; None for
    fewer than three samples."""
    xs = [float(x) for x in xs or () if _ok(x)]
    if len(xs) < 3:
        return None
    med = statistics.median(xs)
    return 1.4826 * statistics.median([abs(x - med) for x in xs]) / med if med else None


def combined_spread(here: Mapping, bandwidth_times: Optional[Sequence[float]] = None) -> float:
    """The relative spread of a decode fraction (decode / bandwidth): the decode and bandwidth
    spreads in quadrature (independent errors), the bandwidth's from its copy timings robustly
    (:func:`robust_cv`) where the run stored them."""
    bw = robust_cv(bandwidth_times) if bandwidth_times else None
    parts = [here.get("decode_cv"), bw if bw is not None else here.get("bandwidth_cv")]
    return math.sqrt(sum(x * x for x in parts if _ok(x)))


def _ok(*xs) -> bool:
    return all(x is not None and isinstance(x, (int, float)) and math.isfinite(x) for x in xs)


def roofline_verdicts(here: Optional[Mapping], others: Sequence[Mapping], kv: Optional[Mapping],
                      *, fairness_here: str = "", bandwidth_times: Optional[Sequence[float]] = None) -> List[dict]:
    """The records of s001-decode-ceiling, -decode-fraction, -kv-read, -ssd-weights and
    -hardware-scaling.

    ``here``: this run's :func:`decode_point` (None if nothing was measured); ``others``: the
    committed points of other platforms (:func:`committed_points`); ``kv``: {"config_bytes_per_token",
    "cache_bytes_per_token", "tokens"} for this run's model (None if not measured).

    ``measured`` keys: decode-ceiling: seed_ceiling_tok_s, ceiling_here_tok_s, decode_here_tok_s,
    bandwidth_here_gb_s, weight_mb_per_step; decode-fraction: fraction_here, fraction_seed,
    fraction_ratio_x, spread_pct; kv-read: seed_kv_gb_23k, seed_kv_gb_130k, kv_bytes_per_token_config,
    kv_bytes_per_token_cache, kv_rel_error, kv_tokens; hardware-scaling: fraction_here,
    fraction_other_median, efficiency_ratio_x, other_points, same_model, other_runs,
    bandwidth_ratio_x, decode_ratio_x.
    """
    seed = seed_arithmetic()
    fair = fairness_here or (_describe(here) if here else "nothing measured in this run")
    out = []
    has_here = here is not None and _ok(here.get("decode_tok_s"), here.get("ceiling_tok_s"))
    spread = 0.0
    if has_here:
        spread = combined_spread(here, bandwidth_times)

    # s001-decode-ceiling
    arith_ok = abs(seed["ceiling_tok_s"] - 180) <= ARITHMETIC_TOL * 180
    m = {"seed_ceiling_tok_s": seed["ceiling_tok_s"],
         "ceiling_here_tok_s": here["ceiling_tok_s"] if has_here else None,
         "decode_here_tok_s": here["decode_tok_s"] if has_here else None,
         "bandwidth_here_gb_s": here["bandwidth_gb_s"] if has_here else None,
         "weight_mb_per_step": here["weight_mb"] if has_here else None}
    if not has_here:
        v = "not measured"
    elif not arith_ok:
        v = "not reproduced"
    else:
        v = _BY_PLACE[place(here["decode_tok_s"], 0.0, here["ceiling_tok_s"], spread)]
    out.append(verdict(
        "s001-decode-ceiling", v, measured=m,
        rule=(f"546 GB/s / 3 GB must recompute to the published ~180 tok/s within {ARITHMETIC_TOL:.0%}, and here "
              f"the measured decode must stay under this machine's ceiling (measured copy bandwidth / bytes of "
              f"weights per step): reproduced if its median does, not reproduced if it exceeds it by more than "
              f"3x the repeats' spread, inconclusive in between (too noisy), not measured without a decode measurement."),
        fairness=f"{fair}; the ceiling counts weights only (the seed's division), the KV read at this short "
                 f"context is a small share", evidence="roofline.json: here"))

    # s001-decode-fraction
    frac = here["fraction"] if has_here else None
    ratio = frac / seed["fraction"] if has_here else None
    lo, hi = seed["fraction"] / FACTOR, seed["fraction"] * FACTOR
    v = _BY_PLACE[place(frac, lo, hi, spread)] if has_here else "not measured"
    out.append(verdict(
        "s001-decode-fraction", v,
        measured={"fraction_here": frac, "fraction_seed": seed["fraction"], "fraction_ratio_x": ratio,
                  "spread_pct": 100 * spread if has_here else None},
        rule=(f"Compares fractions of the ceiling, not tok/s: this machine's measured decode / its ceiling against "
              f"the seed's 65 / 182 = {seed['fraction']:.0%}; reproduced when ours lies within a factor {FACTOR:g} "
              f"of it ({lo:.0%}-{hi:.0%}), not reproduced when it lies outside by more than 3x the repeats' "
              f"spread (spread_pct: the decode CV and the copy timings' robust CV in quadrature), inconclusive in "
              f"between (too noisy)."),
        fairness=(f"{fair}; our ceiling divides by the measured copy bandwidth, the seed's by the 546 GB/s "
                  f"datasheet peak, which makes our fraction larger than one against a peak; our model is far "
                  f"smaller than the seed's 35B MoE (3 GB per step), so fixed per-step costs weigh more"),
        evidence="roofline.json: here"))

    # s001-kv-read
    arith_kv = (abs(seed["kv_gb_23k"] - 0.46) <= 0.02 * 0.46 and abs(seed["kv_gb_130k"] - 2.6) <= 0.02 * 2.6)
    cfg_b = kv.get("config_bytes_per_token") if kv else None
    cache_b = kv.get("cache_bytes_per_token") if kv else None
    err = abs(cfg_b - cache_b) / cache_b if _ok(cfg_b, cache_b) and cache_b else None
    v = "not measured" if err is None else "reproduced" if arith_kv and err <= KV_TOL else "not reproduced"
    out.append(verdict(
        "s001-kv-read", v,
        measured={"seed_kv_gb_23k": seed["kv_gb_23k"], "seed_kv_gb_130k": seed["kv_gb_130k"],
                  "kv_bytes_per_token_config": cfg_b, "kv_bytes_per_token_cache": cache_b, "kv_rel_error": err,
                  "kv_tokens": kv.get("tokens") if kv else None},
        rule=(f"20 KB x 23k and x 130k tokens must recompute to the published 0.46 and 2.6 GB within 2%, and for "
              f"our model the per-token KV bytes from its config (2 x full-attention layers x KV heads x head_dim "
              f"x bytes) must equal the bytes mlx-lm's cache holds per token within {KV_TOL:.0%}; else not "
              f"reproduced."),
        fairness=(f"{fair}; checks the per-token arithmetic the seed's 20 KB rests on against a real cache, not "
                  f"the seed's hybrid model (all our layers are full attention) nor that a step reads it all"),
        evidence="roofline.json: kv"))

    # s001-ssd-weights: no SSD tier here
    out.append(not_testable("s001-ssd-weights"))

    # s001-hardware-scaling
    same = [p for p in others if has_here and (p["preset"], p["dtype"], p["bits"]) ==
            (here["preset"], here["dtype"], here["bits"])]
    use = same or list(others)
    runs = sorted({f"{p['platform']}/{p['source']}@{p['commit']}" for p in use})
    if not has_here or not use:
        m = {"fraction_here": frac, "fraction_other_median": None, "efficiency_ratio_x": None,
             "other_points": 0, "same_model": False, "other_runs": "", "bandwidth_ratio_x": None,
             "decode_ratio_x": None}
        v, rule = "not measured", ("Only one machine's measurement is available, so whether decode scales with "
                                   "bandwidth is not measured; the seed's table (65 tok/s x bandwidth / 546 GB/s) "
                                   "is recomputed in hardware_estimates.")
    else:
        f_other = statistics.median(p["fraction"] for p in use)
        eff = f_other / frac
        bw_ratio = statistics.median(p["bandwidth_gb_s"] for p in use) / here["bandwidth_gb_s"]
        dec_ratio = statistics.median(p["decode_tok_s"] for p in use) / here["decode_tok_s"]
        m = {"fraction_here": frac, "fraction_other_median": f_other, "efficiency_ratio_x": eff,
             "other_points": len(use), "same_model": bool(same), "other_runs": ", ".join(runs),
             "bandwidth_ratio_x": bw_ratio, "decode_ratio_x": dec_ratio}
        v = _BY_PLACE[place(eff, 1 / FACTOR, FACTOR, spread)]
        rule = (f"Compares this run with committed runs of other machines ({', '.join(runs)}): the seed's rule "
                f"(decode x bandwidth ratio, efficiency held fixed) holds if each machine decodes the same "
                f"fraction of its own ceiling; reproduced when the other runs' median fraction is within a factor "
                f"{FACTOR:g} of this run's, not reproduced when further off than 3x this run's spread, not "
                f"inconclusive in between"
                + ("." if same else "; no model ran on both, so the fractions are of different models."))
    out.append(verdict(
        "s001-hardware-scaling", v, measured=m, rule=rule,
        fairness=(f"{fair}; the other points: " + ("; ".join(_describe(p) for p in use) if use else "none") +
                  ". Runs at different commits on different days; another machine's bandwidth is its measured "
                  "copy rate where a roofline run recorded one, else its datasheet figure; models this small may "
                  "be bound by per-step launch costs on a GPU rather than by bandwidth, which the seed's 3 GB "
                  "steps are less likely to be"),
        evidence="roofline.json: here, others"))
    return out


def decide_stored(doc: dict, path=None) -> List[dict]:
    """The verdicts of a saved ``roofline.json`` (notebook 07; :class:`~mlxlab.studies.base.Study`'s
    ``decide``): this run's point and KV bytes as stored, beside the other platforms' points the run
    stored (``others``, as they were committed then); a document without them reads the committed
    files of the results folder above its platform's (:func:`committed_points`)."""
    missing = [k for k in ("here", "kv") if k not in doc]
    if missing:
        raise ValueError(f"{path or 'this document'} is not a roofline result (no {', '.join(missing)}): "
                         "rescore a roofline.json")
    others = doc.get("others")
    if others is None:
        if path is None:
            raise ValueError("this roofline result stores no others and has no path to find them from")
        from mlxlab.studies.roofline.run import load_hardware_table

        plat = (doc.get("environment") or {}).get("platform")
        top = next((p for p in Path(path).resolve().parents if p.name == plat), Path(path).resolve().parent)
        others = committed_points(top.parent, load_hardware_table(), exclude_platform=plat)
    return roofline_verdicts(doc["here"], others, doc["kv"], bandwidth_times=(doc.get("bandwidth") or {}).get("times_s"))
