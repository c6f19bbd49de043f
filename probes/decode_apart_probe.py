"""Decode-apart probe: a streaming chat beside documents that ask for a few tokens each, with the
documents joining the chat's decode batch (mlx-lm's way) or decoding in their own forward
(``Engine(decode_apart=N)``).

Over HTTP on an H100 the chat's ITL p99 beside four 16,000-token documents fell by about half when
the documents asked for one token instead of eight (``data/results/h100/http_levers_*.json``): a
document that decodes joins the chat's batch, which left-pads the chat's rows to the document's
length and masks them until it leaves. This probe isolates that in one process on one model object:
a chat of ``--chat-context`` tokens decodes; after its first 8 tokens documents of ``--doc-tokens``
arrive back to back (the next when the last one finishes), each asking for ``--doc-max-tokens``,
until the chat has streamed ``--chat-tokens``. Each setting of ``--apart`` (``none``: every row
joins; a number: ``decode_apart``) runs this once per repeat, the order alternating, plus the chat
alone as the reference; the chat's gaps after the first document arrived are pooled per setting.

Usage::

    python -m probes.decode_apart_probe --model small --doc-tokens 2048 --repeats 5     # CPU
    python -m probes.decode_apart_probe --model qwen2.5-0.5b --bits 4 --doc-tokens 16000  # GPU

Writes ``data/results/<platform>/decode_apart_probe.json``.
"""

from __future__ import annotations

import random
import statistics
import sys
from typing import List, Optional

import numpy as np

from mlxlab.engine.loop import Engine
from probes import common

WARM = 8  # chat tokens before the first document arrives


def parse_args(argv=None):
    p = common.parser(__doc__, "decode_apart_probe")
    p.add_argument("--policy", default="slo")
    p.add_argument("--chunk-size", type=int, default=2048)
    p.add_argument("--chat-context", type=int, default=1536)
    p.add_argument("--chat-tokens", type=int, default=256, help="chat tokens after the documents start")
    p.add_argument("--doc-tokens", type=int, default=4096)
    p.add_argument("--doc-max-tokens", type=int, default=8)
    p.add_argument("--apart", default="none,1024", help="decode_apart settings, comma-separated (none: rows join)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    return common.parse(p, argv)


def scene(model, args, apart: Optional[int], chat_prompt: List[int], rng: random.Random, docs: bool = True) -> dict:
    """One chat (beside back-to-back documents, unless ``docs`` is False) on a fresh engine: the
    chat's gaps after the first document arrived (alone: after its first ``WARM`` tokens), the
    documents finished, the rows that decoded apart and the chat's tokens."""
    eng = Engine(model, policy=args.policy, chunk_size=args.chunk_size, decode_apart=apart)
    chat = eng.submit(chat_prompt, WARM + args.chat_tokens)
    while len(chat.output_tokens) < WARM:
        eng.step()
    start, sent, apart_rows = len(chat.token_times_s), [], set()
    while not chat.done:
        if docs and (not sent or sent[-1].done):
            sent.append(eng.submit([rng.randrange(1, model.vocab_size) for _ in range(args.doc_tokens)],
                                   args.doc_max_tokens))
        eng.step()
        apart_rows |= {s.req.id for s in eng._solo}
    finished = sum(d.done for d in sent)  # by the chat's last token
    eng.run()
    gaps = np.diff(chat.token_times_s[start - 1:]) * 1e3
    return {"gaps_ms": gaps.tolist(), "docs_finished": finished, "rows_apart": len(apart_rows),
            "span_s": chat.token_times_s[-1] - chat.token_times_s[start - 1], "tokens": list(chat.output_tokens)}


def summary(gaps: List[float]) -> dict:
    g = np.asarray(gaps)
    return {"itl_p50_ms": float(np.percentile(g, 50)), "itl_p99_ms": float(np.percentile(g, 99)),
            "itl_max_ms": float(g.max()), "n_gaps": int(g.size)}


def main(argv=None) -> int:
    args = parse_args(argv)
    model = common.load(args)
    rng = random.Random(args.seed)
    chat_prompt = [rng.randrange(1, model.vocab_size) for _ in range(args.chat_context)]
    settings = [None if a.strip() == "none" else int(a) for a in args.apart.split(",")]
    label = {a: "joined" if a is None else f"apart_{a}" for a in settings}
    for a in settings:  # first use of every shape, not timed
        scene(model, args, a, chat_prompt, random.Random(args.seed + 1))
    runs = {label[a]: [] for a in settings}
    runs["solo"] = []
    for r in range(args.repeats):
        order = settings if r % 2 == 0 else settings[::-1]
        for a in order:  # the same documents for every setting of a repeat
            row = scene(model, args, a, chat_prompt, random.Random(args.seed + 100 + r))
            runs[label[a]].append(row)
            common.log("apart", f"repeat {r + 1}/{args.repeats} {label[a]:>12}: chat ITL p99 "
                                f"{np.percentile(row['gaps_ms'], 99):7.1f} ms, {row['docs_finished']} documents, "
                                f"{row['rows_apart']} rows apart")
        runs["solo"].append(scene(model, args, None, chat_prompt, rng, docs=False))
    out = {}
    for name, rows in runs.items():
        out[name] = {**summary([g for row in rows for g in row["gaps_ms"]]),
                     "itl_p99_ms_runs": [float(np.percentile(row["gaps_ms"], 99)) for row in rows],
                     "docs_per_s": statistics.median(row["docs_finished"] / row["span_s"] for row in rows),
                     "rows_apart": [row["rows_apart"] for row in rows]}
    base = runs[label[settings[0]]]
    for name, rows in runs.items():
        if name != "solo":
            out[name]["same_tokens_as_first"] = sum(a["tokens"] == b["tokens"] for a, b in zip(rows, base))
            common.log("apart", f"{name:>12}: chat ITL p99 {out[name]['itl_p99_ms']:.1f} ms (solo "
                                f"{out['solo']['itl_p99_ms']:.1f}), {out[name]['docs_per_s']:.2f} documents/s")
    common.save(args, "decode_apart_probe", {
        "config": {"model": args.model, "bits": args.bits, "dtype": str(model.dtype), "policy": args.policy,
                   "chunk_size": args.chunk_size, "chat_context": args.chat_context, "chat_tokens": args.chat_tokens,
                   "doc_tokens": args.doc_tokens, "doc_max_tokens": args.doc_max_tokens, "apart": args.apart,
                   "repeats": args.repeats, "seed": args.seed},
        "settings": out, "runs": {k: [{**row, "tokens": None} for row in v] for k, v in runs.items()}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
