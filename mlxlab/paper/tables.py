"""The paper's appendix: one table per results file, generated from ``data/results/``.

Each table names its source file with the device and versions that produced it (the former
``paper/results.md``, now rendered into the paper). Every file read goes through the build's
:class:`~mlxlab.paper.context.ResultsStore`, so it also appears in the reproducibility section.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Dict, List

from mlxlab.paper.context import ResultsStore


def _fmt(x, nd=2) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, (int, float)):
        return f"{x:.{nd}f}" if isinstance(x, float) else str(x)
    if isinstance(x, dict):
        return ", ".join(f"{k}: {_fmt(v, nd)}" for k, v in list(x.items())[:6])
    if isinstance(x, list):
        return ", ".join(_fmt(v, nd) for v in x[:6])
    return str(x)


def _table(header: List[str], rows: List[List]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(_fmt(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def _source(store: ResultsStore, path: Path, doc: Dict) -> str:
    env = doc.get("environment", {})
    return (f"*Source: `{store.label(path)}` — {env.get('device_name', '?')} ({env.get('device', '?')}), "
            f"mlx {env.get('mlx', '?')}, mlx-lm {env.get('mlx_lm', '?')}, BLAS {env.get('blas', '?')}, "
            f"written {env.get('written_at', '?')}.*")


def bench_section(store: ResultsStore, paths: List[Path]) -> str:
    parts = ["## Engine against mlx-lm (same model object, same run)\n",
             "Ratio = mlxlab / mlx-lm, medians over repeats; single stream against `generate_step`, "
             "8 concurrent streams against `BatchGenerator`. In brackets: the median of the per-repeat "
             "ratios (both sides run back to back in each repeat), where the file has them.\n"]
    for p in paths:
        d = store.load(p)
        rows = []
        for preset, r in d["presets"].items():
            m = r["model"]
            rows.append([f"{preset} ({m['dtype'].split('.')[-1]}, {m['bits'] or 'no'} bits)"] +
                        [f"{r[k]['mlxlab']['median']:.1f} / {r[k]['mlx_lm']['median']:.1f} = **{r[k]['ratio']:.3f}**"
                         + (f" ({r[k]['paired_ratio_median']:.3f})" if "paired_ratio_median" in r[k] else "")
                         for k in ("single_prefill_tok_s", "single_decode_tok_s", "batched_decode_tok_s")])
        parts += [f"### {p.parent.name}: `{p.name}`\n", _table(["model", "prefill tok/s", "decode tok/s", "8-stream decode tok/s"], rows),
                  "", _source(store, p, d), ""]
    return "\n".join(parts)


def claims_section(store: ResultsStore, title: str, paths: List[Path]) -> str:
    parts = [f"## {title}\n"]
    for p in paths:
        d = store.load(p)
        claims = d.get("claims") or []
        if not claims:
            continue
        rows = []
        for c in claims:
            verdict = c.get("verdict") or ("met" if c.get("passed") else "not met") if "passed" in c or "verdict" in c else ""
            rows.append([c.get("name", ""), c.get("goal", c.get("published", "")), c.get("measured"), verdict])
        notes = [f"- {n}" for n in d.get("notes") or [] if isinstance(n, str)]
        parts += [f"### {p.parent.name}: `{p.name}`\n", _table(["claim", "goal / published", "measured", "verdict"], rows),
                  "", *notes, *([""] if notes else []), _source(store, p, d), ""]
    return "\n".join(parts)


def sim_section(store: ResultsStore, paths: List[Path]) -> str:
    """One table per validation file: ``sim_validation.json`` (the latest run) first, then the
    other runs and re-scorings on file (``validate-sim --name``, ``--rescore``)."""
    parts = ["## Simulator against engine\n"]
    for p in sorted(paths, key=lambda q: (q.parent.name, q.stem != "sim_validation", q.stem)):
        d = store.load(p)
        s = d.get("summary", {})
        rows = [[m, v.get("median_rel_error"), v.get("max_rel_error"), f"{v.get('within_10pct')}/{v.get('n')}",
                 f"{v.get('passed')}/{v.get('n')}"] for m, v in s.items() if isinstance(v, dict)]
        title = p.parent.name if p.stem == "sim_validation" else f"{p.parent.name}: {p.stem}"
        parts += [f"### {title}\n"]
        if d.get("source"):  # a re-scoring (validate-sim --rescore): no run of its own
            parts += [f"The runs of `{d['source']}` scored again by this version's cost model and simulator "
                      f"(each profile share fitted again, the engine's side as measured).", ""]
        parts += [d.get("rule") or "", "",
                  _table(["metric", "median rel. error", "max rel. error", "within 10%", "within noise rule"], rows), ""]
        sent = [x["itl_p50_s"] * 1e3 for x in (d.get("sentinels") or {}).get("runs", [])]
        if sent:
            parts += [f"Sentinel (a lone chat before every profile share and engine run): ITL p50 median "
                      f"{statistics.median(sent):.2f} ms, {min(sent):.2f}-{max(sent):.2f} ms over {len(sent)} runs.", ""]
        if d.get("environment"):
            parts += [_source(store, p, d), ""]
        else:
            parts += [f"*Source: `{store.label(p)}`.*", ""]
    return "\n".join(parts)


def single_request_section(store: ResultsStore, res: Path) -> str:
    """Prefix restores, warm vs cold turns, warm-up and the KV probe, from the single-request
    files that hold them (the notebooks' and ``probes/h200_singlereq.py``'s)."""
    parts = ["## Single-request features\n"]
    for p in sorted(res.glob("*/prefix_cache.json")):
        if "quick" in p.parts:
            continue
        d = store.load(p)
        if d.get("restore"):
            rows = [[r["prefix_tokens"], r["kv_bytes"] / 2**20, 1e3 * r["prefill_s"], 1e3 * r["restore_memory_s"],
                     1e3 * r["restore_disk_s"], r["speedup_memory"], r["speedup_disk"]] for r in d["restore"]]
            parts += [f"### {p.parent.name}: prefix restore against prefill ({d.get('model')})\n",
                      _table(["prefix tokens", "KV MiB", "prefill ms", "restore (memory) ms", "restore (disk) ms",
                              "memory speedup", "disk speedup"], rows), ""]
        if d.get("warm_vs_cold"):
            rows = [[r["prefix_tokens"], r["turn_tokens"], 1e3 * r["cold_ttft_s"], 1e3 * r["warm_ttft_s"], r["speedup"],
                     r["restored_tokens"], r["same_first_token"]] for r in d["warm_vs_cold"]]
            parts += ["Warm vs cold chat turn through the engine:\n",
                      _table(["prefix tokens", "new tokens", "cold TTFT ms", "warm TTFT ms", "speedup", "restored",
                              "same first token"], rows), ""]
        parts += [_source(store, p, d), ""]
    for p in sorted(res.glob("*/warmup_memory.json")):
        d = store.load(p)
        if "quick" in p.parts or not d.get("runs"):
            continue
        rows = []
        for r in d["runs"]:
            ev = {e["event"]: e["ttft_s"] for e in r["events"] if e["event"] != "warm request"}
            warm = sorted(e["ttft_s"] for e in r["events"] if e["event"] == "warm request")
            ws = r["warmup_s"]
            rows.append([r["model"], r["warmup"], sum(ws.values()) if isinstance(ws, dict) else ws,
                         ev.get("first request"), warm[len(warm) // 2] if warm else None] +
                        [f"{_fmt(ev.get(f'first use of {x}'))} / {_fmt(ev.get(f'again {x}'))}"
                         for x in ("chunk 2048", "batch 4", "batch 8")])
        parts += [f"### {p.parent.name}: first-request TTFT by warm-up mode (fresh process each)\n",
                  _table(["preset", "warm-up", "warm-up s", "first TTFT s", "warm TTFT s", "chunk 2048 first / again s",
                          "batch 4 first / again s", "batch 8 first / again s"], rows), "", _source(store, p, d), ""]
    for p in sorted(res.glob("*/kv_quantization.json")):
        d = store.load(p)
        if "quick" in p.parts or not d.get("probes"):
            continue
        rows = [[b, v[0], v[1] or "runs"] for b, v in d["probes"].items()]
        parts += [f"### {p.parent.name}: can the backend run a quantized KV cache? ({d.get('model')})\n",
                  _table(["kv bits", "runs", "probe says"], rows), "", _source(store, p, d), ""]
    return "\n".join(parts)


def probes_section(store: ResultsStore, res: Path) -> str:
    """The H200 probes behind the simulator's cost terms: a chunk's cost by its exact size, a batch
    change phase by phase (per mlx CUDA-graph setting), a lone decode between other work, and a
    long prefill with its KV cache sized up front or grown."""
    parts = []
    for p in sorted(res.glob("*/chunk_probe.json")):
        d = store.load(p)
        rows = [[r["context"], r["tokens"], "yes" if (r["context"] + r["tokens"]) % 8 == 0 else "no",
                 r["median_s"] * 1e3, r["per_token_us"]] for r in d["rows"]]
        parts += [f"### One prefill chunk by its exact size ({p.parent.name})\n",
                  _table(["context", "chunk tokens", "key length multiple of 8", "ms (median)", "us/token"], rows),
                  "", _source(store, p, d), ""]
    for p in sorted(res.glob("*/rebatch_probe_*.json")):
        d = store.load(p)
        rows = []
        for scen in ("join4", "filter2", "extract1", "steady_b1", "steady_b2"):
            sel = [r for r in d["rows"] if r["scenario"] == scen and r["set"] == "short"]
            if sel:
                rows.append([scen, 1e3 * statistics.median(r["host_s"] for r in sel),
                             1e3 * statistics.median(r["eval_s"] for r in sel),
                             1e3 * statistics.median(r["decode_s"][0] for r in sel),
                             1e3 * statistics.median(x for r in sel for x in r["decode_s"][2:])])
        parts += [f"### A change of the decode batch, phase by phase ({p.parent.name}, {d.get('label')})\n",
                  _table(["scenario", "host ms", "device copy ms", "first decode ms", "later decodes ms"], rows),
                  "", _source(store, p, d), ""]
    for p in sorted(res.glob("*/decode_probe.json")):
        d = store.load(p)
        rows = [[i + 1, r["phase"], r["n"], r["p50_ms"], r["p90_ms"]] for i, r in enumerate(d["phases"]) if r["n"]]
        parts += [f"### A lone stream's decode, again and again between other work ({p.parent.name})\n",
                  _table(["#", "phase", "gaps", "ITL p50 ms", "ITL p90 ms"], rows), "", _source(store, p, d), ""]
    for p in sorted(res.glob("*/align_ab.json")):
        d = store.load(p)
        rows = [[r["workload"], r["policy"], r["tenant"], r["metric"], r["aligned"] * 1e3, r["unaligned"] * 1e3,
                 r["unaligned_over_aligned"]] for r in d["rows"]]
        parts += [f"### The engine with aligned chunks (key_align=8) and without (1), {d['repeats']} alternating "
                  f"repeats ({p.parent.name})\n",
                  _table(["workload", "policy", "tenant", "metric", "aligned ms", "unaligned ms", "unaligned / aligned"],
                         rows), "", _source(store, p, d), ""]
    for p in sorted(res.glob("*/presize_probe.json")):
        d = store.load(p)
        rows = [[r["chunk"], r["presized_median_s"] * 1e3, r["grown_median_s"] * 1e3, r["speedup"]] for r in d["rows"]]
        parts += [f"### A {d['prompt']:,}-token prefill, KV cache sized up front or grown by 256 ({p.parent.name})\n",
                  _table(["chunk", "sized ms (median)", "grown ms (median)", "speedup"], rows), "", _source(store, p, d), ""]
    for p in sorted(res.glob("*/decode_modes.json")):
        d = store.load(p)
        fmt = lambda xs: ", ".join(f"{x:.1f}" for x in xs)  # noqa: E731
        rows = [[r["file"], fmt(r["engine_run_medians_ms"]), fmt(r["profile_share_medians_ms"]),
                 fmt(r["sim_share_medians_ms"])] for r in d["rows"]]
        parts += [f"### Decodes of {d['batch']} rows in `{d['run']}`: engine runs against profile shares "
                  f"(`{d['profile_cell']}`), medians in ms ({p.parent.name})\n",
                  f"From the steps the {p.parent.name} validation files keep (`python -m probes.decode_modes`, run "
                  f"anywhere; the source line names the machine that read them).", "",
                  _table(["validation", "engine, per repeat", "profile, per share", "simulator, per share"], rows),
                  "", _source(store, p, d), ""]
    return "\n".join(["## Probes behind the simulator's cost terms\n"] + parts) if parts else ""


def appendix_markdown(store: ResultsStore) -> str:
    """The tables of every results file (not the quick runs), one section per kind of study."""
    res = store.results
    files = lambda name: sorted(p for p in res.glob(f"*/{name}.json"))  # noqa: E731
    sections = [bench_section(store, files("bench_engine*")),
                claims_section(store, "Multi-tenant scheduling on the real engine", files("scheduling*")),
                single_request_section(store, res),
                sim_section(store, files("sim_validation*")),
                probes_section(store, res),
                claims_section(store, "The case study at its own scale (simulator, published profile)",
                               files("seed_scale"))]
    text = "\n".join(s for s in sections if s.strip()) + "\n"
    # one heading level down: the appendix sits under the paper's own section heading
    return "\n".join("#" + line if line.startswith("#") else line for line in text.splitlines()) + "\n"
