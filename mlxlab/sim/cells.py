"""The groups of grid cells a device profile measures, one function each (MLX).

* :func:`prefill_group`: prefill-only chunks of each size after one context;
* :func:`decode_group`: decode phases at each batch size at one context, each opened by a batch
  change timed alone ("rebatch"), pipelined decodes ("decode", the last one "tail"), then decode
  plus a chunk of a long prompt, back to back ("mixed") and as one packed forward ("packed");
* :class:`JoinCase`: a long row joining a short row's decode and leaving it again;
* :class:`RaggedCase`: rows of four different lengths joining one decode batch one by one (a
  left-padded batch of two, three, four rows) and leaving it again ("rebatch", ragged);
* :func:`cold_group`: chunks of token counts nothing else in the profile runs, each run twice at
  once ("fresh"): its first use (``cold_chunks`` 1) and again, warm;
* :func:`overhead_run`: the host time between steps of a short workload ("overhead").

Each records into its :class:`mlxlab.sim.rig.Bench` (see :mod:`mlxlab.sim.measure` for what a
record's ``duration_s`` means for each kind).
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

from mlxlab.core.plan import StepPlan
from mlxlab.core.runner import run_workload
from mlxlab.core.workload import BatchTenant, ChatTenant, Workload
from mlxlab.engine.loop import Engine
from mlxlab.sim.rig import Bench, Rig


def prefill_group(bench: Bench, c: int) -> None:
    """One prompt: a context of ``c`` tokens (fill chunks), then one chunk of each size."""
    sizes = [n for n in bench.prefill_tokens if c + n + 2 <= bench.max_ctx]
    total = c + sum(sizes)
    while sizes and total + 2 > bench.max_ctx:
        total -= sizes.pop()
    if not sizes:
        bench.skipped.append(f"prefill context {c}: no chunk fits the context of {bench.max_ctx}")
        return
    rig = bench.rig()
    req = rig.submit(bench.tokens(total + 1), 1)
    bench.fill(rig, req, c)
    for n in sizes:
        bench.keep(bench.timed(rig, StepPlan(prefill=[(req.id, n)]), "prefill")[0])


# a decode group's steps, in order: (record or StepRecord, kind, phase index, index in phase)
Step = Tuple[object, str, int, int]


def decode_group(bench: Bench, c: int, batches: Sequence[int]) -> None:
    """Decode phases at batch sizes from the largest down (rows leave as they reach their
    max_tokens), each phase followed by mixed steps. In a phase: the first decode, which
    changes the batch (the join of every row, then rows dropped), is timed on its own with
    nothing in flight ("rebatch"); the next decodes run pipelined as in the engine and the
    gaps between one stream's token reads are the decode records, leaving out the first
    (the pipeline refilling) and the last, which the next step's flush reads at once: that
    gap is how long a forward runs after the engine returned from queueing it ("tail")."""
    bs = sorted({int(b) for b in batches}, reverse=True)
    mix_sizes = list(bench.prefill_tokens) if bench.mixed else []
    kinds = ("mixed", "packed") if bench.packed else ("mixed",)
    k = bench.decode_steps + len(mix_sizes) * len(kinds)  # steps per phase
    if c + k * len(bs) + 2 > bench.max_ctx:
        bench.skipped.append(f"decode context {c}: does not fit the context of {bench.max_ctx}")
        return
    rig = bench.rig()
    reqs = [rig.submit(bench.tokens(c), k * sum(1 for b in bs if i < b)) for i in range(bs[0])]
    long_len = min(bench.max_ctx - 2, sum(mix_sizes) * len(bs) * len(kinds) + 2) if mix_sizes else 0
    long_req = rig.submit(bench.tokens(long_len), 1) if mix_sizes else None
    for r in reqs:
        if c > 1:
            bench.fill(rig, r, c - 1)
    steps: List[Step] = []
    long_done, prev_b = 0, 0
    for p, b in enumerate(bs):
        ctx = c - 1 + p * k + 1  # each row's context at the phase's first decode (prompt + forwards)
        steps.append((_first_decode(bench, rig, prev_b, b, c, ctx), "first", p, 0))
        for j in range(1, bench.decode_steps):
            steps.append((rig.step(StepPlan(decode=True)), f"decode b{b} c{c}", p, j))
        for n in mix_sizes:
            for kind in kinds:
                if long_done + n > long_len - 1:
                    continue
                steps.append((_mixed_step(bench, rig, kind, b, c, long_req.id, n, long_done), kind, p, -1))
                long_done += n
        prev_b = b
    rig.flush()
    _decode_records(bench, reqs[0].token_times_s, steps)


def _first_decode(bench: Bench, rig: Rig, prev_b: int, b: int, c: int, ctx: int) -> dict:
    """A phase's first decode, timed alone: it changes the batch (kept as "rebatch" when that
    copies anything)."""
    if prev_b == 0:  # every row joins at once (a lone row starts on its own cache: no copy)
        change = {"join_tokens": b * ctx if b > 1 else 0}
    else:  # rows leave: filter copies the kept rows at the old width, extract the one row left
        change = {"drop_tokens": b * ctx if b > 1 else ctx}
    copies = any(change.values())
    d = bench.timed_alone(rig, StepPlan(decode=True), "rebatch" if copies else "decode1",
                          cell=f"rebatch b{prev_b}->{b} c{c}")
    d.update(change, decode_kv_tokens=b * ctx)
    if copies:
        bench.keep(d)
    return d


def _mixed_step(bench: Bench, rig: Rig, kind: str, b: int, c: int, long_id: int, n: int, at: int) -> dict:
    """Decode of the batch plus an ``n``-token chunk of the long prompt, back to back ("mixed")
    or as one packed forward ("packed")."""
    rig.eng.fuse = kind == "packed"
    d, _ = bench.timed(rig, StepPlan(decode=True, prefill=[(long_id, n)]), kind,
                       cell=f"{kind} b{b} c{c} n{n} at{at}")
    rig.eng.fuse = False
    d["decode_kv_tokens"] = b * (d["decode_context_tokens"] // b)
    bench.keep(d)
    return d


def _decode_records(bench: Bench, times: List[float], steps: List[Step]) -> None:
    """The pipelined decodes' records: one stream's token-read gaps, the first two of a phase
    left out, the last before a non-decode step kept as "tail"."""
    if len(times) != len(steps):
        raise RuntimeError(f"profile bookkeeping: {len(times)} token times for {len(steps)} decode steps")
    for j, (rec, kind, _, i) in enumerate(steps):
        if not kind.startswith("decode") or i < 2:
            continue
        d = rec.as_dict()
        last = j + 1 == len(steps) or not steps[j + 1][1].startswith("decode")
        d.update(kind="tail" if last else "decode", engine_duration_s=d["duration_s"],
                 duration_s=times[j] - times[j - 1], cell=("tail " if last else "") + kind,
                 decode_kv_tokens=d["decode_batch"] * (d["decode_context_tokens"] // max(1, d["decode_batch"])))
        bench.keep(d)


class JoinCase:
    """What happens when a prompt finishes prefilling in the workloads, in a decode-only step
    (``case`` "decode") or in a step with a chunk beside it ("packed", or "mixed" back to
    back): a short row's first decode, alone ("start": its prefilled cache becomes the decode
    cache); a long row (``c_long``) joining it ("join": the lone cache becomes a batch and is
    extended at the long row's width); the steps right after, where the short row reads the
    long row's width of left padding; the long row leaving ("drop": the short row is
    extracted back to a plain cache). Starts and changes are timed alone, as rebatch cells
    are; the decodes after the join are pipelined token gaps, as in :func:`decode_group`."""

    def __init__(self, bench: Bench, c_long: int, case: str):
        self.bench, self.c_long, self.case = bench, c_long, case
        self.c0 = max(2, min(bench.decode_contexts))
        self.chunked = case != "decode"
        self.n_mix = min(bench.prefill_tokens)
        self.k_after = bench.decode_steps if not self.chunked else 4
        self.tag = f"{case} c{self.c0}+{c_long}"

    def fits(self) -> bool:
        k, m = self.bench.decode_steps, self.bench.max_ctx
        return self.c_long + self.k_after + 4 <= m and self.c0 + 3 * k + 8 <= m

    def run(self) -> None:
        bench, tag = self.bench, self.tag
        if not self.fits():
            bench.skipped.append(f"join context {self.c_long}: does not fit the context of {bench.max_ctx}")
            return
        self.rig = rig = bench.rig()
        short = rig.submit(bench.tokens(self.c0), 3 * bench.decode_steps)
        long_row = rig.submit(bench.tokens(self.c_long), self.k_after + 1)
        self.filler = (rig.submit(bench.tokens(min(bench.max_ctx - 2, self.n_mix * (self.k_after + 6) + 2)), 1)
                       if self.chunked else None)
        bench.fill(rig, short, self.c0 - 1, record=False)
        self.alone("start", f"start {tag}")
        for _ in range(2):  # the short row settles in alone
            self.alone(self.case, "", record=False)
        bench.fill(rig, long_row, self.c_long - 1, record=False)
        change = "join_chunk" if self.chunked else "rebatch"
        # both rows are copied at the long row's width, its context at its first decode: c_long
        self.alone(change, f"join {tag}", join_tokens=2 * self.c_long)
        if self.chunked:
            for j in range(self.k_after):
                self.alone(self.case, f"{self.case} after join {tag} #{j + 1}")
        else:
            self.pipelined_after_join(short)
        self.alone(change, f"drop {tag}", drop_tokens=short.prompt_tokens + len(short.output_tokens))

    def alone(self, kind: str, cell: str, record: bool = True, **fields) -> dict:
        """A step timed alone: a decode, beside a chunk of the filler prompt when chunked."""
        plan = StepPlan(decode=True, prefill=[(self.filler.id, self.n_mix)] if self.chunked else [])
        self.rig.eng.fuse = self.case == "packed"
        try:
            d = self.bench.timed_alone(self.rig, plan, kind, cell=cell)
        finally:
            self.rig.eng.fuse = False
        b = d["decode_batch"]
        d.update(decode_kv_tokens=b * self.rig.decode_width() if b > 1 else d["decode_context_tokens"], **fields)
        if record:
            self.bench.keep(d)
        return d

    def pipelined_after_join(self, short) -> None:
        """Decode-only steps after the join, timed as the gaps of the short row's token reads
        (the first refills the pipeline, the last is a tail: both left out)."""
        i0 = len(short.token_times_s)
        widths = [(self.rig.step(StepPlan(decode=True)), self.rig.decode_width()) for _ in range(self.k_after)]
        self.rig.flush()
        times = short.token_times_s[i0:]
        if len(times) != len(widths):
            raise RuntimeError(f"profile bookkeeping: {len(times)} token times for {len(widths)} decode steps")
        for j in range(2, len(widths) - 1):
            rec, wj = widths[j]
            d = rec.as_dict()
            d.update(kind="decode", engine_duration_s=d["duration_s"], duration_s=times[j] - times[j - 1],
                     cell=f"decode b2 {self.tag}", decode_kv_tokens=d["decode_batch"] * wj)
            self.bench.keep(d)


class RaggedCase:
    """A decode batch of rows with four different prompt lengths (``c0`` up to ``c_long``): row 0
    decodes alone, rows 1, 2, 3 join one at a time (``k`` decode steps apart; each join leaves a
    left-padded ``BatchKVCache`` of two, three, four rows), then rows 3, 2, 1 leave in turn
    (``filter`` to three and two ragged rows, ``extract`` to one). Every change is timed alone
    ("rebatch", cells ``ragged join b2..4`` and ``ragged drop b3..1``), so the fit prices a change
    into a ragged batch (``ragged_change_rows``) beside the even ones of :func:`decode_group`."""

    def __init__(self, bench: Bench, c_long: int, k: int = 4):
        self.bench, self.k = bench, k
        c0 = max(2, min(bench.decode_contexts))
        self.lengths = [c0 + (c_long - c0) * i // 3 for i in range(4)]

    def fits(self) -> bool:
        return len(set(self.lengths)) == 4 and self.lengths[-1] + 7 * self.k + 4 <= self.bench.max_ctx

    def run(self) -> None:
        bench, k = self.bench, self.k
        if not self.fits():
            bench.skipped.append(f"ragged rows {self.lengths}: need four lengths within the context of {bench.max_ctx}")
            return
        rig = bench.rig()
        # row i joins at decode step i*k and leaves at (7 - i)*k; row 0 stays to the end
        reqs = [rig.submit(bench.tokens(n), (7 - 2 * i) * k if i else 7 * k + 2) for i, n in enumerate(self.lengths)]
        bench.fill(rig, reqs[0], self.lengths[0] - 1, record=False)
        for t in range(7 * k):
            i = t // k
            if t % k == 0 and 1 <= i <= 3:  # the next row finishes its prefill: it joins at this decode
                bench.fill(rig, reqs[i], self.lengths[i] - 1, record=False)
            if t % k == 0 and t:
                self.change(rig, "join" if i <= 3 else "drop")
            else:
                rig.step(StepPlan(decode=True))
        rig.flush()

    def change(self, rig: Rig, what: str) -> None:
        """A step that changes the ragged batch, timed alone, with the bytes it copies."""
        rows_before, width_before = rig.decode_rows(), rig.decode_width()
        d = self.bench.timed_alone(rig, StepPlan(decode=True), "rebatch", cell="")
        b, width = d["decode_batch"], rig.decode_width()
        d["cell"] = f"ragged {what} b{b}"
        if what == "join":
            d.update(join_tokens=b * width, decode_kv_tokens=b * width)
        else:
            kept = b if rows_before > b else 0
            d.update(drop_tokens=kept * width_before if b > 1 else d["decode_context_tokens"],
                     decode_kv_tokens=b * width if b > 1 else d["decode_context_tokens"])
        self.bench.keep(d)


def cold_group(bench: Bench, c: int) -> None:
    """Chunks of token counts nothing else in the profile runs (three quarters of each grid size,
    on the key alignment), each at once twice on one prompt after a context of ``c``: the first
    meets its shape for the first time in this profile (``cold_chunks`` 1), the second does not.
    Run after the other groups, so many other shapes ran since the process last saw anything like
    it, as a workload's odd-sized chunk meets the engine."""
    sizes = sorted({max(8, (3 * n // 4) // 8 * 8) for n in bench.prefill_tokens} - set(bench.sizes_run))
    sizes = [n for n in sizes if c + 2 * sum(sizes) + 2 <= bench.max_ctx]
    if not sizes:
        bench.skipped.append(f"cold chunks at context {c}: no fresh size fits the context of {bench.max_ctx}")
        return
    rig = bench.rig()
    req = rig.submit(bench.tokens(c + 2 * sum(sizes) + 1), 1)
    bench.fill(rig, req, c, record=False)
    for n in sizes:
        for _ in range(2):
            bench.keep(bench.timed(rig, StepPlan(prefill=[(req.id, n)]), "fresh")[0])


def overhead_run(bench: Bench, seed: int) -> None:
    """Host time between steps that no record covers (run loop, scheduler state, policy):
    a short workload through :func:`mlxlab.core.runner.run_workload` under ``interleave``, the
    gaps between a step's end and the next one's start after steps that end inside
    ``Engine.step`` (prefill-only and mixed; a pipelined decode's record ends when its
    tokens are read, inside the next step)."""
    n = min(4 * bench.fill_chunk, bench.max_ctx - 64)
    wl = Workload([ChatTenant(sessions=2, turns=1, first_prompt_tokens=32, output_tokens=12, think_time_s=0.0),
                   BatchTenant(workers=1, requests=1, prompt_tokens=n, output_tokens=2)],
                  vocab_size=bench.vocab, seed=seed, max_context=bench.max_ctx)
    res = run_workload(Engine(bench.model, policy="interleave", chunk_size=bench.fill_chunk), wl)
    st = res.executor.steps
    for a, b in zip(st, st[1:]):
        if a.phase != "decode" and b.start_s >= a.end_s:
            bench.keep({"kind": "overhead", "cell": "overhead", "duration_s": b.start_s - a.end_s,
                        "phase": a.phase, "decode_batch": 0, "prefill_tokens": 0})
