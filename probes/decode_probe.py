"""Decode probe: does a lone stream's decode cost depend on what the process ran before it?

The H200 validation of the simulator found a lone stream decoding at 4.4 ms per token in the
engine's runs, while the profile, measured minutes apart in the same process, put the same
step at 5.3-9 ms. This probe measures one thing, the inter-token latency of a lone stream
(``lone``: one 1,024-token prompt, 64 tokens, ``interleave``, the median gap after the first
two tokens), again and again in one process, between "disturbers" that each stand for something
the profile or the validation runs do:

* ``packed``: a ``stall_free`` run (packed steps: one forward for decodes and a chunk) with a
  long prompt beside a chat;
* ``big_prefill``: one 16k-token prompt prefilled alone;
* ``batch2``: two streams decoding together (the batched path, then each one alone);
* ``profile_mixed`` / ``profile_plain``: a small :func:`mlxlab.sim.measure.profile_device` grid with
  and without its mixed and packed steps; its own lone-decode cell is reported beside ``lone``;
* ``gc_off``: ``lone`` with Python's garbage collector off.

If ``lone`` after a disturber is slower than before it, the profile measures decode in a state
the workload runs do not share (or the other way round).

Usage::

    python -m probes.decode_probe --model small --prompt 64 --tokens 16   # CPU smoke run
    bash scripts/h200_batch.sh decodes                                    # the H200 run

Writes ``data/results/<platform>/decode_probe.json``: each phase in order with its ITL median,
p90 and every gap.
"""

from __future__ import annotations

import gc
import random
import statistics
import sys
import time

from mlxlab.engine.loop import Engine
from mlxlab.sim.measure import profile_device
from probes import common


def parse_args(argv=None):
    p = common.parser(__doc__, "decode_probe")
    p.add_argument("--prompt", type=int, default=1024, help="the lone stream's prompt tokens")
    p.add_argument("--tokens", type=int, default=64, help="the lone stream's output tokens")
    p.add_argument("--long", type=int, default=16384, help="the long prompt of packed / big_prefill")
    return common.parse(p, argv)


def gaps(req, skip: int = 2) -> list:
    """The request's inter-token gaps after its first ``skip`` tokens."""
    t = req.token_times_s
    return [b - a for a, b in zip(t[skip:], t[skip + 1:])]


class Phases:
    """The lone stream and its disturbers, each recorded as a phase in the order they ran."""

    def __init__(self, model, args):
        self.model, self.args = model, args
        self.rng = random.Random(0)
        self.rows = []

    def prompt(self, n: int) -> list:
        return [self.rng.randrange(1, self.model.vocab_size) for _ in range(n)]

    def note(self, name: str, g: list, **extra) -> None:
        row = {"phase": name, "n": len(g), "p50_ms": 1e3 * statistics.median(g) if g else None,
               "p90_ms": 1e3 * sorted(g)[int(0.9 * (len(g) - 1))] if g else None,
               "gaps_ms": [round(1e3 * x, 3) for x in g],
               "at_s": round(time.perf_counter() - self.args.started, 2), **extra}
        self.rows.append(row)
        common.log("decode_probe", f"{name:16s} p50 {row['p50_ms'] or float('nan'):7.2f} ms  p90 "
                                   f"{row['p90_ms'] or float('nan'):7.2f} ms  n={len(g)}  at {row['at_s']} s")

    def lone(self, name: str = "lone") -> None:
        eng = Engine(self.model, policy="interleave")
        r = eng.submit(self.prompt(self.args.prompt), self.args.tokens)
        eng.run()
        self.note(name, gaps(r))

    def lone_gc_off(self, runs: int) -> None:
        gc.disable()
        try:
            for _ in range(runs):
                self.lone("gc_off")
        finally:
            gc.enable()

    def packed(self) -> None:
        eng = Engine(self.model, policy="stall_free")
        chat = eng.submit(self.prompt(self.args.prompt), self.args.tokens)
        eng.submit(self.prompt(self.args.long // 2), 8)
        eng.run()
        self.note("packed", gaps(chat), what="the chat's gaps under stall_free, packed steps, 8k prompt beside it")

    def big_prefill(self) -> None:
        eng = Engine(self.model, policy="interleave")
        eng.submit(self.prompt(self.args.long), 1)
        t0 = time.perf_counter()
        eng.run()
        self.note("big_prefill", [], seconds=time.perf_counter() - t0)

    def batch2(self) -> None:
        eng = Engine(self.model, policy="interleave")
        a = eng.submit(self.prompt(self.args.prompt), self.args.tokens)
        eng.submit(self.prompt(self.args.prompt), self.args.tokens // 2)
        eng.run()
        g = gaps(a)
        half = self.args.tokens // 2 - 2
        self.note("batch2", g[:half], after_alone=[round(1e3 * x, 3) for x in g[half + 2:]],
                  alone_p50_ms=1e3 * statistics.median(g[half + 2:]) if g[half + 2:] else None)

    def profile(self, mixed: bool) -> None:
        out = profile_device(self.model, prefill_tokens=(256,), contexts=(0,), decode_batches=(1, 2),
                             decode_contexts=(self.args.prompt,), repeats=1, mixed=mixed, warmup=False,
                             measure_overhead=False)
        cells = {r.get("cell"): r["duration_s"] for r in out["cells"]}
        b1 = [r["duration_s"] for r in out["records"] if r.get("cell", "").startswith("decode b1")]
        self.note("profile_mixed" if mixed else "profile_plain", b1,
                  cells_ms={k: round(1e3 * v, 3) for k, v in cells.items() if k}, wall_s=out["wall_s"])


def run_sequence(ph: Phases) -> None:
    """The lone stream between each disturber, twice where a first run could differ."""
    ph.lone("warm")  # first use of every kernel
    ph.lone()
    ph.lone()
    ph.batch2()
    ph.lone()
    ph.packed()
    ph.lone()
    ph.lone()
    ph.big_prefill()
    ph.lone()
    ph.profile(mixed=True)
    ph.lone()
    ph.profile(mixed=False)
    ph.lone()
    ph.lone_gc_off(runs=2)
    ph.lone()
    ph.packed()
    ph.lone()


def main(argv=None) -> int:
    args = parse_args(argv)
    model = common.load(args)
    ph = Phases(model, args)
    run_sequence(ph)
    common.save(args, "decode_probe", {"model": args.model, "bits": args.bits, "dtype": str(model.dtype),
                                       "prompt": args.prompt, "tokens": args.tokens, "long": args.long,
                                       "phases": ph.rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
