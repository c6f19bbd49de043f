"""probes/shape_probe.py: each trial meets a key length or a chunk size no trial ran before, then runs
the same chunk again, and the summary pairs the two."""

import argparse
import time

import mlx.core as mx

from probes.chunk_probe import prefilled
from probes.shape_probe import ALIGN, measure, summarize


def test_each_trial_meets_a_new_key_or_a_new_size_and_runs_it_again(tiny):
    args = argparse.Namespace(tokens=40, context=24, trials=3, started=time.perf_counter())
    toks = mx.random.randint(1, tiny.vocab_size, (1, 24 + ALIGN * 3 + 40), key=mx.random.key(0)).astype(mx.uint32)
    args.base = prefilled(tiny.module, toks, args.context)
    runs = measure(tiny.module, toks, args)
    assert all(len(v) == 3 for v in runs.values())
    keys = [r["key"] for r in runs["new_key"]]
    assert len(set(keys)) == 3 and args.context + args.tokens not in keys  # every key length new
    assert {r["tokens"] for r in runs["new_key"]} == {40}
    sizes = [r["tokens"] for r in runs["new_size"]]
    assert sizes == [32, 24, 16] and {r["key"] for r in runs["new_size"]} == {64}  # new sizes, the known key
    assert [(r["tokens"], r["key"]) for r in runs["new_size_again"]] == list(zip(sizes, [64] * 3))
    s = summarize(runs)
    assert set(s["first_use_extra_ms"]) == {"new_key", "new_size"}
    firsts = [a["s"] - b["s"] for a, b in zip(runs["new_key"], runs["new_key_again"])]
    assert min(firsts) * 1e3 <= s["first_use_extra_ms"]["new_key"] <= max(firsts) * 1e3
