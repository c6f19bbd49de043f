"""Seed 001's stall, admission gate and chunk-size trade-off as one fair experiment (notebook 05).

Every run has one chat stream that decodes from the start; ``W`` batch workers each send one
long prompt of ``prompt_tokens`` tokens once the chat streams. The policies compared
(``interleave``: one decode step, then a chunk of every waiting prompt; ``admission_gate``: one
big prompt at a time; ``stall_free``: a token budget per step; ``admission_gate_window``: the
gate with a decode window held open after each chunk) run the same seeded workloads on one model
object, at the same chunk sizes (stall_free's budget = the chunk), with the repeats outermost and
the configurations in a seeded shuffled order within each repeat, so drift in the machine hits
all of them alike. References, measured in every repeat: the chat alone (its solo rate and ITL)
and one long prompt alone at each chunk size (its alone TTFT and chunk step; the *floor* is the
lowest alone TTFT over the chunk sizes).

Scale. The seed's figures come from a 35B MoE on an M4 Max, where a 2,048-token chunk step lasts
1-2 s against a 15 ms decode step. Here ``ref_chunk`` stands for the seed's 2,048 and the sweep
is ``ref_chunk`` x (1/8, 1/4, 1/2, 1), the seed's 256 / 512 / 1,024 / 2,048 in proportion; the
verdicts (:mod:`mlxlab.studies.admission_gate.verdict`) compare ratios, not seconds: rates to the chat's
solo rate (the seed's 65 tok/s), gaps to the gap at ``ref_chunk`` (the seed's 1.5 s), and report
the step of ``ref_chunk`` in solo decode steps beside the seed's ~100.

One run's numbers (:func:`gate_run_metrics`): the chat's rate over the *prefill window* (its
tokens between the first long prompt's arrival and the last long prompt's first token, over that
time), its rate over the *decode-only windows* (its gaps in the prefill window that no long-prompt
chunk ran in), its contended ITL p50/p99 and worst gap, the long prompts' TTFT (last and mean)
and the longest one-chunk step; per cell, medians over repeats with their min and max, and the ITL
percentiles over the pooled gaps of all repeats (:func:`summarize`).
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import asdict, dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from mlxlab.core.presets import model_limits
from mlxlab.core.runner import run_workload
from mlxlab.core.workload import Workload
from mlxlab.studies.scheduling.metrics import med, q, ratio, run_metrics
from mlxlab.studies.scheduling.plan import batch_tenant, chat_tenant

POLICIES = ("interleave", "admission_gate", "stall_free", "admission_gate_window")
SEED_CHUNKS = (256, 512, 1024, 2048)  # the seed's chunk sizes; 2048 is its setting
FRACTIONS = tuple(c / SEED_CHUNKS[-1] for c in SEED_CHUNKS)  # (1/8, 1/4, 1/2, 1)
STALL_FREE_ALIGN = 8  # stall_free's chunks end on multiples of this (mlxlab.core.plan.KEY_ALIGN)

#: the grids; a notebook parameter that is not None overrides the preset's value
PRESETS = {
    "full": dict(workers=(1, 2, 4), worker_fractions=(0.25, 0.5, 1.0), stall_free_workers=(1, 4),
                 stall_free_fractions=(0.25,), window_workers=(1, 2), stall_prompt_chunks=6, repeats=5,
                 solo_tokens=64),
    "quick": dict(workers=(1, 2), worker_fractions=(0.25, 1.0), stall_free_workers=(1,), stall_free_fractions=(0.25,),
                  window_workers=(1,), stall_prompt_chunks=4, repeats=1, solo_tokens=32),
}


@dataclass(frozen=True)
class Cell:
    """One configuration: a policy at a chunk size with ``workers`` long prompts of
    ``prompt_tokens`` tokens (0: the plan's)."""
    policy: str
    chunk: int
    workers: int
    prompt_tokens: int = 0

    @property
    def key(self) -> str:
        tail = f"/p{self.prompt_tokens}" if self.prompt_tokens else ""
        return f"{self.policy}/c{self.chunk}/w{self.workers}{tail}"

    def prompt(self, plan: "GatePlan") -> int:
        return self.prompt_tokens or plan.prompt_tokens


@dataclass(frozen=True)
class GatePlan:
    """The experiment's sizes and its configurations (see :func:`plan_gate`)."""
    ref_chunk: int
    prompt_tokens: int
    chunks: Tuple[int, ...]
    workers: Tuple[int, ...]
    cells: Tuple[Cell, ...]
    repeats: int
    window_steps: int
    chat_prompt_tokens: int
    solo_tokens: int
    batch_output_tokens: int
    seed: int
    vocab: int
    max_context: int
    quick: bool
    model_name: str

    @property
    def stall_cell(self) -> Optional[Cell]:
        """The stall at the seed's condition: interleave, one long prompt of many chunks."""
        return next((c for c in self.cells if c.prompt_tokens), None)

    @property
    def sweet_chunks(self) -> Tuple[int, int]:
        """The counterparts of the seed's 512 and 1,024."""
        return self.ref_chunk // 4, self.ref_chunk // 2

    def prompt_tokens_per_repeat(self) -> int:
        """Long-prompt tokens one repeat prefills (its references included): the run's cost."""
        return self.prompt_tokens * len(self.chunks) + sum(c.workers * c.prompt(self) for c in self.cells)

    def config(self) -> dict:
        d = asdict(self)
        d["cells"] = [c.key for c in self.cells]
        d["sweet_chunks"] = list(self.sweet_chunks)
        d["seed_chunks"] = list(SEED_CHUNKS)
        return d


def default_ref_chunk() -> int:
    """The counterpart of the seed's 2,048-token chunk on this device: 2048 on a GPU; 512 on a
    CPU, where a 512-token chunk step of the ``small`` preset lasts ~60 decode steps and a
    1,024-token one ~140 (the seed: 1-2 s against 15 ms, 67-133)."""
    import mlx.core as mx  # only to ask for the device

    return 2048 if mx.default_device().type == mx.DeviceType.gpu else 512


def plan_gate(model, *, quick: bool = False, ref_chunk: Optional[int] = None, prompt_chunks: int = 2,
              workers: Optional[Sequence[int]] = None, worker_fractions: Optional[Sequence[float]] = None,
              stall_free_workers: Optional[Sequence[int]] = None,
              stall_free_fractions: Optional[Sequence[float]] = None, window_workers: Optional[Sequence[int]] = None,
              window_fraction: float = 0.5, window_steps: int = 8, stall_prompt_chunks: Optional[int] = None,
              repeats: Optional[int] = None,
              chat_prompt_tokens: int = 32, solo_tokens: Optional[int] = None, batch_output_tokens: int = 2,
              seed: int = 0) -> GatePlan:
    """The experiment's configurations. ``model``: a loaded model, an mlx-lm module or a config dict.

    * every chunk of ``ref_chunk`` x :data:`FRACTIONS` at one worker: interleave, admission_gate,
      stall_free (budget = chunk);
    * the chunks ``ref_chunk`` x ``worker_fractions`` at every further worker count of
      ``workers``: interleave and admission_gate; stall_free at ``ref_chunk`` x
      ``stall_free_fractions`` where the count is in ``stall_free_workers``;
    * ``admission_gate_window`` at chunk ``ref_chunk * window_fraction`` for ``window_workers``,
      its window ``window_steps`` solo decode steps long;
    * the stall at the seed's condition: interleave at ``ref_chunk`` with one prompt of
      ``stall_prompt_chunks`` chunks (the chat's rate over a prefill window of few chunks is
      dominated by the tokens at its edges: the decode steps in flight when the prompt arrives).

    Long prompts are ``prompt_chunks`` x ``ref_chunk`` tokens. ``quick`` picks the quick preset of
    :data:`PRESETS` for the options left None."""
    pre = PRESETS["quick" if quick else "full"]
    workers = tuple(sorted({int(w) for w in (workers or pre["workers"])}))
    ref = int(ref_chunk or default_ref_chunk())
    if ref < 8 or ref % 8:
        raise ValueError(f"ref_chunk must be a multiple of 8 (its fractions are chunk sizes), got {ref}")
    if not workers or workers[0] < 1 or prompt_chunks < 1:
        raise ValueError("workers and prompt_chunks must be positive")
    vocab, max_ctx = model_limits(model)
    prompt = prompt_chunks * ref
    if prompt + batch_output_tokens >= max_ctx:
        raise ValueError(f"long prompts of {prompt} tokens do not fit the model's context ({max_ctx})")
    chunks = tuple(max(1, round(ref * f)) for f in FRACTIONS)
    wchunks = tuple(max(1, round(ref * f)) for f in (worker_fractions or pre["worker_fractions"]))
    sf_w = set(stall_free_workers or pre["stall_free_workers"])
    sf_c = {max(1, round(ref * f)) for f in (stall_free_fractions or pre["stall_free_fractions"])}
    win_w = set(window_workers or pre["window_workers"])
    stall_prompt = (stall_prompt_chunks or pre["stall_prompt_chunks"]) * ref
    if stall_prompt + batch_output_tokens >= max_ctx:
        raise ValueError(f"the stall's prompt of {stall_prompt} tokens does not fit the model's context ({max_ctx})")
    cells: List[Cell] = []
    for w in workers:
        for c in (chunks if w == 1 else wchunks):
            cells += [Cell("interleave", c, w), Cell("admission_gate", c, w)]
            if w in sf_w and (w == 1 or c in sf_c):
                cells.append(Cell("stall_free", c, w))
        if w in win_w:
            cells.append(Cell("admission_gate_window", max(1, round(ref * window_fraction)), w))
    if stall_prompt != prompt:
        cells.append(Cell("interleave", ref, 1, stall_prompt))
    return GatePlan(ref_chunk=ref, prompt_tokens=prompt, chunks=chunks, workers=workers, cells=tuple(cells),
                    repeats=int(repeats or pre["repeats"]), window_steps=int(window_steps),
                    chat_prompt_tokens=int(chat_prompt_tokens), solo_tokens=int(solo_tokens or pre["solo_tokens"]),
                    batch_output_tokens=int(batch_output_tokens), seed=int(seed), vocab=vocab, max_context=max_ctx,
                    quick=bool(quick), model_name=str(getattr(model, "name", None) or type(model).__name__))


# ---------------------------------------------------------------------------------- one run
def _chunk_steps(res, batch_ids) -> List[Tuple[float, float]]:
    """(start, end) of every step that ran a chunk of a long prompt."""
    tl = res.timeline
    if not len(tl) or "prefill_seqs" not in tl:
        return []
    return [(float(s), float(e)) for s, e, seqs in zip(tl.start_s, tl.end_s, tl.prefill_seqs)
            if batch_ids & set(seqs)]


def _overlap(a: float, b: float, steps) -> float:
    """The largest share of one chunk step that lies inside the gap (a, b). A gap that holds a
    chunk holds more than half of its step (a mixed step starts with its decode, whose token may
    close the gap before the chunk runs); a decode-only gap touches no chunk step at all."""
    return max((max(0.0, min(b, e) - max(a, s)) / (e - s) for s, e in steps if e > s), default=0.0)


def gate_run_metrics(res, chunk: Optional[int] = None) -> dict:
    """One run's numbers (seconds, tokens/s), from a :class:`mlxlab.core.runner.RunResult` of a
    chat (tenant ``chat``) beside long prompts (tenant ``batch``): :func:`run_metrics`'s chat ITL
    p50/p99 over the contended gaps, worst gap, long TTFT (the last first token) and one-chunk
    step times, plus ``chat_rate_tok_s`` (the whole stream), ``prefill_window_s`` (the first long
    prompt's arrival to the last one's first token), ``chat_prefill_tok_s`` (the chat's tokens
    strictly inside that window / its length), ``chat_chunk_gap_p50_s`` (the median of the chat's
    gaps that a long-prompt chunk ran in), ``window_gaps`` and ``chat_window_tok_s`` (the chat's
    gaps between the first chunk step's start and the last one's end that no chunk ran in: the
    decode windows between chunks, and their rate), ``window_time_fraction`` (their share of the
    prefill window), ``long_ttft_mean_s``, ``longest_step_s`` (the longest step that ran a
    long-prompt chunk) and ``chat_covered`` (the chat still streamed when the window closed)."""
    m = run_metrics(res, chunk)
    chat = [r for r in res.submitted if r.tenant == "chat"]
    batch = [r for r in res.submitted if r.tenant == "batch"]
    nan = float("nan")
    out = {k: m[k] for k in ("chat_ttft_s", "chat_itl_p50_s", "chat_itl_p99_s", "chat_worst_gap_s",
                             "long_ttft_s", "chunk_time_s", "chunk_time_max_s", "wall_s", "complete")}
    out["contended_gaps_s"] = list(m["contended_gaps_s"])
    times = [t for r in chat for t in r.token_times_s]
    span = (max(times) - min(times)) if len(times) > 1 else 0.0
    out["chat_rate_tok_s"] = (len(times) - 1) / span if span > 0 else nan
    ttfts = [r.ttft_s for r in batch if r.ttft_s is not None]
    out["long_ttft_mean_s"] = sum(ttfts) / len(ttfts) if ttfts else nan
    steps = _chunk_steps(res, {r.id for r in batch})
    out["longest_step_s"] = max((e - s for s, e in steps), default=nan)
    out.update(chat_covered=None, prefill_window_s=nan, chat_tokens_in_window=0, chat_prefill_tok_s=nan,
               chat_chunk_gap_p50_s=nan, window_gaps=0, chat_window_tok_s=nan, window_time_fraction=nan)
    if not (batch and all(r.token_times_s for r in batch) and chat):
        return out
    start, end = min(r.arrival_s for r in batch), max(r.token_times_s[0] for r in batch)
    window = end - start
    n_in = sum(1 for t in times if start < t < end)  # the token beside the last first token is the end
    gaps = [(a, b) for r in chat for a, b in zip(r.token_times_s, r.token_times_s[1:]) if b > start and a < end]
    held = [b - a for a, b in gaps if _overlap(a, b, steps) > 0.5]
    first, last = (min(s for s, _ in steps), max(e for _, e in steps)) if steps else (end, start)
    free = [b - a for a, b in gaps if first <= a and b <= last and _overlap(a, b, steps) == 0.0]
    out.update(chat_covered=all(r.token_times_s and r.token_times_s[-1] >= end for r in chat),
               prefill_window_s=window, chat_tokens_in_window=n_in,
               chat_prefill_tok_s=n_in / window if window > 0 else nan, chat_chunk_gap_p50_s=q(held, 50),
               window_gaps=len(free), chat_window_tok_s=len(free) / sum(free) if free and sum(free) > 0 else nan,
               window_time_fraction=sum(free) / window if window > 0 else nan)
    return out


# ---------------------------------------------------------------------------------- the runs
def executor_factory(model, kind: str = "engine", cost_model=None) -> Callable[[str, int, dict], object]:
    """``make(policy, chunk, options)`` -> a fresh executor: the engine on ``model``, or the
    simulator (``kind="sim"``) with ``cost_model``."""
    if kind == "sim":
        from mlxlab.sim.simulator import Simulator

        return lambda policy, chunk, opts: Simulator.for_model(model, cost_model, policy=policy, chunk_size=chunk,
                                                               **opts)
    if kind != "engine":
        raise ValueError(f"kind must be 'engine' or 'sim', got {kind!r}")
    from mlxlab.engine.loop import Engine  # MLX: only when the engine runs

    return lambda policy, chunk, opts: Engine(model, policy=policy, chunk_size=chunk, **opts)


@dataclass(frozen=True)
class Calibration:
    """Repeat 0's solo chat: it fixes when the long prompts arrive (just after the chat's first
    tokens, so that a machine running faster or slower than during the calibration leaves the chat
    streaming when they come, at little cost), the decode window and how long the chat streams."""
    solo_itl_s: float
    solo_ttft_s: float
    lead_tokens: int = 8  # chat tokens budgeted before the arrival (about 3 at the calibrated pace)

    @property
    def arrival_s(self) -> float:
        return self.solo_ttft_s + 2 * self.solo_itl_s

    def window_s(self, steps: int) -> float:
        return steps * self.solo_itl_s

    def chat_tokens(self, plan: GatePlan, cell: Cell) -> int:
        """Chat tokens that outlast the prefill window: a lead-in past the arrival, one token per
        step while the long prompts prefill (plus twice the window's decode steps: a faster
        machine fits more into a window of fixed seconds), and a margin."""
        L = cell.prompt(plan)
        per_prompt = math.ceil(L / max(1, cell.chunk))
        if cell.policy == "interleave":
            steps = per_prompt * math.ceil(cell.workers / 8)  # Interleave's prefill_batch_size
        elif cell.policy == "stall_free":
            steps = cell.workers * (math.ceil(L / max(1, cell.chunk - STALL_FREE_ALIGN)) + 1)
        else:
            window = 2 * (plan.window_steps + 1) if cell.policy == "admission_gate_window" else 0
            steps = cell.workers * per_prompt * (1 + window)
        n = self.lead_tokens + math.ceil(1.2 * steps) + 6 + plan.batch_output_tokens
        return max(2, min(n, plan.max_context - plan.chat_prompt_tokens - 1))


def _options(plan: GatePlan, calib: Calibration, cell: Cell) -> dict:
    big = {"big_prompt_tokens": max(1, plan.prompt_tokens // 2)}
    return {"interleave": {}, "admission_gate": big, "stall_free": {"token_budget": cell.chunk},
            "admission_gate_window": {**big, "window_s": calib.window_s(plan.window_steps)}}[cell.policy]


def _workload(plan: GatePlan, chat_tokens: int, workers: int, start_s: float, prompt_tokens: int = 0) -> Workload:
    tenants = [chat_tenant(plan.chat_prompt_tokens, chat_tokens)] if chat_tokens else []
    if workers:
        tenants.append(batch_tenant(workers, prompt_tokens or plan.prompt_tokens, plan.batch_output_tokens, start_s))
    return Workload(tenants, vocab_size=plan.vocab, seed=plan.seed, max_context=plan.max_context)


def _token_rows(res) -> List[dict]:
    """The chat's token times and the long prompts' arrivals and first tokens, from the first arrival."""
    t0 = min(r.arrival_s for r in res.submitted)
    rows = [{"stream": "chat", "t_s": t - t0} for r in res.submitted if r.tenant == "chat" for t in r.token_times_s]
    for r in res.submitted:
        if r.tenant == "batch":
            rows.append({"stream": "long prompt arrives", "t_s": r.arrival_s - t0})
            if r.token_times_s:
                rows.append({"stream": "long prompt's first token", "t_s": r.token_times_s[0] - t0})
    return rows


def gate_study(model, plan: Optional[GatePlan] = None, *, make_executor=None, warmup: bool = True,
               log: Optional[Callable[[str], None]] = None, progress: bool = False, **options) -> dict:
    """Run the experiment: ``plan`` (default :func:`plan_gate` with ``options``) on executors from
    ``make_executor`` (default: the engine on ``model``, see :func:`executor_factory`). ``log`` gets
    one line per run; ``progress`` shows a progress bar over the runs.

    Returns a JSON-ready dict: ``config``, ``calibration``, ``references``, ``table`` (one row per
    cell, :func:`summarize`), ``runs`` (every run's scalars, with its repeat) and ``wall_s``; and
    ``timelines`` (repeat 0's token times per cell key, for plots; not meant for saving)."""
    t_start = time.perf_counter()
    plan = plan or plan_gate(model, **options)
    make = make_executor or executor_factory(model)
    say = log or (lambda s: None)
    if warmup:  # every chunk size once, with a chat, and stall_free's packed steps: unrecorded
        for c in plan.chunks:
            for pol, opts in (("interleave", {}), ("stall_free", {"token_budget": c})):
                run_workload(make(pol, c, opts), _workload(plan, 8, 1, 0.0, min(plan.prompt_tokens, c + 16)))
    runs: List[dict] = []
    timelines: Dict[str, list] = {}

    def measure(rep: int, kind: str, cell: Optional[Cell], chunk: int, calib: Optional[Calibration]) -> dict:
        if kind == "solo":
            ex, wl = make("interleave", chunk, {}), _workload(plan, plan.solo_tokens, 0, 0.0)
        elif kind == "alone":
            ex, wl = make("interleave", chunk, {}), _workload(plan, 0, 1, 0.0)
        else:
            ex = make(cell.policy, chunk, _options(plan, calib, cell))
            wl = _workload(plan, calib.chat_tokens(plan, cell), cell.workers, calib.arrival_s, cell.prompt(plan))
        res = run_workload(ex, wl)
        m = gate_run_metrics(res, chunk)
        key = cell.key if cell else f"{kind}/c{chunk}"
        if rep == 0 and cell:
            timelines[key] = _token_rows(res)
        rec = {"repeat": rep, "kind": kind, "key": key, "chunk_size": chunk, "policy": cell.policy if cell else kind,
               "workers": cell.workers if cell else int(kind == "alone"),
               "prompt_tokens": cell.prompt(plan) if cell else plan.prompt_tokens * (kind == "alone"), **m}
        runs.append(rec)
        say(f"[gate] r{rep} {key:34s} prefill-window {m['chat_prefill_tok_s']:7.2f} tok/s  worst gap "
            f"{m['chat_worst_gap_s'] * 1e3:8.1f} ms  long TTFT {m['long_ttft_s']:7.3f} s  ({m['wall_s']:.1f} s)")
        return m

    solo0 = measure(0, "solo", None, plan.ref_chunk, None)
    calib = Calibration(med(solo0["contended_gaps_s"]), solo0["chat_ttft_s"])  # no batch: every gap
    say(f"[gate] solo ITL {calib.solo_itl_s * 1e3:.2f} ms; long prompts arrive at {calib.arrival_s:.3f} s; "
        f"decode window {calib.window_s(plan.window_steps) * 1e3:.1f} ms")
    bar = None
    if progress:
        from tqdm.auto import tqdm  # notebook plumbing, optional

        bar = tqdm(total=plan.repeats * (1 + len(plan.chunks) + len(plan.cells)) - 1, desc="admission gate runs")
    for rep in range(plan.repeats):
        jobs = ([] if rep == 0 else [("solo", None, plan.ref_chunk)]) + [("alone", None, c) for c in plan.chunks] \
            + [("cell", c, c.chunk) for c in plan.cells]
        random.Random(f"{plan.seed}:{rep}").shuffle(jobs)
        for kind, cell, chunk in jobs:
            measure(rep, kind, cell, chunk, calib)
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    out = summarize(runs, plan)
    out.update(config=plan.config(), calibration={"solo_itl_s": calib.solo_itl_s, "solo_ttft_s": calib.solo_ttft_s,
                                                   "arrival_s": calib.arrival_s,
                                                   "window_s": calib.window_s(plan.window_steps)},
               runs=[{k: v for k, v in r.items() if not isinstance(v, list)} for r in runs],
               wall_s=time.perf_counter() - t_start, timelines=timelines)
    return out


# ---------------------------------------------------------------------------------- aggregation
SCALARS = ("chat_prefill_tok_s", "chat_chunk_gap_p50_s", "chat_window_tok_s", "window_time_fraction", "window_gaps",
           "chat_itl_p50_s", "chat_itl_p99_s", "chat_worst_gap_s", "long_ttft_s", "long_ttft_mean_s", "chunk_time_s",
           "chunk_time_max_s", "longest_step_s", "prefill_window_s", "chat_rate_tok_s", "wall_s",
           "ttft_premium_pct", "ttft_over_floor_pct", "prefill_over_solo_x", "window_over_solo_x", "gap_over_step_x")


def _finite(x) -> Optional[float]:
    """A run's figure for a per-repeat list: None where it measured none (JSON has no NaN)."""
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def _stats(values) -> Tuple[float, float, float]:
    """(median, min, max) of the finite values (NaN when none)."""
    v = [float(x) for x in values if x is not None and isinstance(x, (int, float)) and math.isfinite(x)]
    return (med(v), min(v), max(v)) if v else (float("nan"),) * 3


def _derive(runs: List[dict], plan: GatePlan) -> None:
    """Each contention run's ratios to its own repeat's references (in place): the TTFT premium
    over W alone prompts at its chunk and over W floors, and its chat rates over the solo rate."""
    solo = {r["repeat"]: r["chat_rate_tok_s"] for r in runs if r["kind"] == "solo"}
    alone = {(r["repeat"], r["chunk_size"]): r["long_ttft_s"] for r in runs if r["kind"] == "alone"}
    floor = {}
    for (rep, _), t in alone.items():
        if math.isfinite(t):
            floor[rep] = min(floor.get(rep, t), t)
    for r in runs:
        if r["kind"] != "cell":
            continue
        rep, w, nan = r["repeat"], r["workers"], float("nan")
        a, f = alone.get((rep, r["chunk_size"]), nan), floor.get(rep, nan)
        if r["prompt_tokens"] != plan.prompt_tokens:  # the alone references prefilled the plan's prompt
            a = f = nan
        r["ttft_premium_pct"] = 100 * (ratio(r["long_ttft_s"], w * a) - 1)
        r["ttft_over_floor_pct"] = 100 * (ratio(r["long_ttft_s"], w * f) - 1)
        r["prefill_over_solo_x"] = ratio(r["chat_prefill_tok_s"], solo.get(rep, float("nan")))
        r["window_over_solo_x"] = ratio(r["chat_window_tok_s"], solo.get(rep, float("nan")))
        r["gap_over_step_x"] = ratio(r["chat_worst_gap_s"], r["chunk_time_max_s"])


def summarize(runs: List[dict], plan: GatePlan) -> dict:
    """``references`` and ``table`` from the runs: per cell (and reference), each of
    :data:`SCALARS` as its median over repeats with ``_lo`` / ``_hi`` (min / max over repeats) and
    ``_runs`` (each repeat's, in repeat order: the verdicts pair two rows' runs by repeat),
    the chat's ITL p50/p99 over the pooled contended gaps of all repeats
    (``chat_itl_p50_pooled_s``, ``chat_itl_p99_pooled_s``) and ``covered_fraction`` (runs whose
    chat streamed through the whole prefill window)."""
    _derive(runs, plan)
    groups: Dict[str, List[dict]] = {}
    for r in runs:
        groups.setdefault(r["key"], []).append(r)
    rows = {}
    for key, rs in groups.items():
        row = {"config": key, "repeats": len(rs), **{k: rs[0][k] for k in ("kind", "policy", "chunk_size", "workers",
                                                                          "prompt_tokens")}}
        by_repeat = sorted(rs, key=lambda r: r["repeat"])
        for k in SCALARS:
            row[k], row[f"{k}_lo"], row[f"{k}_hi"] = _stats(r.get(k) for r in rs)
            row[f"{k}_runs"] = [_finite(r.get(k)) for r in by_repeat]  # by repeat: the verdicts' noise bands
        pooled = [g for r in rs for g in r["contended_gaps_s"]]
        row["chat_itl_p50_pooled_s"], row["chat_itl_p99_pooled_s"] = q(pooled, 50), q(pooled, 99)
        cov = [r["chat_covered"] for r in rs if r["chat_covered"] is not None]
        row["covered_fraction"] = sum(cov) / len(cov) if cov else None
        rows[key] = row
    solo = rows.get(f"solo/c{plan.ref_chunk}", {})
    solo_gaps = [g for r in groups.get(f"solo/c{plan.ref_chunk}", []) for g in r["contended_gaps_s"]]
    alone = {c: rows.get(f"alone/c{c}", {}) for c in plan.chunks}
    floor = {c: a.get("long_ttft_s", float("nan")) for c, a in alone.items()}
    finite = {c: t for c, t in floor.items() if math.isfinite(t)}
    refs = {"solo_tok_s": solo.get("chat_rate_tok_s"), "solo_tok_s_lo": solo.get("chat_rate_tok_s_lo"),
            "solo_tok_s_hi": solo.get("chat_rate_tok_s_hi"), "solo_tok_s_runs": solo.get("chat_rate_tok_s_runs"),
            "solo_itl_s": q(solo_gaps, 50),
            "solo_itl_p99_s": q(solo_gaps, 99),
            "alone_ttft_s": floor, "alone_ttft_lo_s": {c: a.get("long_ttft_s_lo") for c, a in alone.items()},
            "alone_ttft_hi_s": {c: a.get("long_ttft_s_hi") for c, a in alone.items()},
            "alone_chunk_time_s": {c: a.get("chunk_time_s") for c, a in alone.items()},
            "floor_s": min(finite.values()) if finite else float("nan"),
            "floor_chunk": min(finite, key=finite.get) if finite else None}
    refs["ref_step_over_solo_itl_x"] = ratio(refs["alone_chunk_time_s"].get(plan.ref_chunk, float("nan")),
                                             refs["solo_itl_s"])
    table = [r for r in rows.values() if r["kind"] == "cell"]
    return {"references": refs, "table": table}
