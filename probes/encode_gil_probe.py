"""What tokenizing a long prompt on the server's event loop costs a streaming chat.

A model directory's tokenizer holds Python's GIL for a whole encode, so while the event loop
tokenizes a posted document the engine thread cannot start its next step. This probe isolates
that cost from the document's prefill: beside one streaming chat (``--chat-tokens`` tokens of a
``--chat-chars`` prompt) a client thread posts ``--docs-per-s`` documents of ``--doc-chars``
characters a second with ``max_tokens: 0``, which the server tokenizes and then refuses (400), so
no document ever reaches the engine. Per repeat and per mode, the chat alone and the chat beside
the posts, as the client saw its tokens arrive (ITL p50 / p99 / max), with the server tokenizing
on its event loop (``inline``) or in a worker process (``process``: ``mlxlab serve
--tokenizer-processes 1``, :mod:`mlxlab.serve.encode`). The model is a preset exported with its
character tokenizer (``mlxlab export-model``: one token per character), in this process.

    python -m probes.encode_gil_probe --model small --repeats 3
"""

from __future__ import annotations

import random
import statistics
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from probes.common import log, parse, parser, save

MODES = {"inline": 0, "process": 1}


def _chat(client, url: str, model: str, prompt: str, max_tokens: int) -> list:
    from mlxlab.studies.serving.against import stream, token_gaps

    run = stream(client, url, model, prompt, max_tokens, user="chat")
    if run["error"]:
        raise RuntimeError(f"the chat failed: {run['error']}")
    return token_gaps(run)[1:]  # the first gap joins the batch


def _poster(client, url: str, model: str, chars: int, per_s: float, stop: threading.Event, out: list) -> None:
    rng = random.Random(7)
    body = {"model": model, "max_tokens": 0}
    while not stop.is_set():
        t = time.perf_counter()
        r = client.post(url + "/v1/completions", json={**body, "prompt": "".join(rng.choice("abcdefgh ") for _ in
                                                                                   range(chars))})
        out.append({"status": r.status_code, "s": time.perf_counter() - t})
        stop.wait(max(0.0, 1.0 / per_s - (time.perf_counter() - t)))


def _figures(gaps: list) -> dict:
    a = np.asarray(gaps) * 1e3
    return {"itl_p50_ms": float(np.percentile(a, 50)), "itl_p99_ms": float(np.percentile(a, 99)),
            "itl_max_ms": float(a.max()), "gaps": len(a)}


def main(argv=None) -> int:
    p = parser(__doc__, "encode_gil_probe")
    p.add_argument("--doc-chars", type=int, default=16000)
    p.add_argument("--chat-chars", type=int, default=600)
    p.add_argument("--chat-tokens", type=int, default=200)
    p.add_argument("--docs-per-s", type=float, default=4.0)
    p.add_argument("--chunk-size", type=int, default=512)
    p.add_argument("--repeats", type=int, default=3)
    args = parse(p, argv)
    import httpx

    from mlxlab import serve
    from mlxlab.engine.export import export_model
    from mlxlab.engine.models import load_model
    from mlxlab.serve.text import tokenizer_for

    rng = random.Random(3)
    runs = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory(prefix="mlxlab-encode-probe-") as tmp:
        mdir = Path(tmp) / args.model
        export_model(args.model, mdir, bits=args.bits, dtype=args.dtype)
        model = load_model(str(mdir))
        tok = tokenizer_for(str(mdir))
        doc = "".join(rng.choice("abcdefgh ") for _ in range(args.doc_chars))
        t0 = time.perf_counter()
        for _ in range(5):
            tok.encode(doc)
        encode_ms = (time.perf_counter() - t0) / 5 * 1e3
        log("encode", f"{args.doc_chars} characters: {encode_ms:.1f} ms per encode here")
        for rep in range(args.repeats):
            for mode in (list(MODES) if rep % 2 == 0 else list(MODES)[::-1]):
                server = serve.build(model, model_name=args.model, tokenizer=tok, chunk_size=args.chunk_size,
                                     tokenizer_processes=MODES[mode])
                url, stop_server = serve.start_background(server, timeout_s=120)
                try:
                    with httpx.Client(timeout=120) as client:
                        prompt = "".join(rng.choice("abcdefgh ") for _ in range(args.chat_chars))
                        _chat(client, url, args.model, prompt, 8)  # warm-up
                        solo = _chat(client, url, args.model, prompt, args.chat_tokens)
                        stop, posts = threading.Event(), []
                        th = threading.Thread(target=_poster, args=(client, url, args.model, args.doc_chars,
                                                                    args.docs_per_s, stop, posts), daemon=True)
                        th.start()
                        time.sleep(0.2)
                        beside = _chat(client, url, args.model, prompt, args.chat_tokens)
                        stop.set()
                        th.join(timeout=60)
                finally:
                    stop_server()
                statuses = sorted({x["status"] for x in posts})
                run = {"repeat": rep, "solo": _figures(solo), "beside": _figures(beside), "posts": len(posts),
                       "post_statuses": statuses, "post_s_median": statistics.median(x["s"] for x in posts)}
                runs[mode].append(run)
                log(mode, f"repeat {rep + 1}: chat ITL p99 alone {run['solo']['itl_p99_ms']:.1f} ms, beside "
                          f"{len(posts)} posts {run['beside']['itl_p99_ms']:.1f} ms (max {run['beside']['itl_max_ms']:.1f}); "
                          f"post statuses {statuses}")
    summary = {m: {k: statistics.median(r["beside"][k] for r in rs) for k in ("itl_p50_ms", "itl_p99_ms", "itl_max_ms")}
               | {"solo_itl_p99_ms": statistics.median(r["solo"]["itl_p99_ms"] for r in rs)} for m, rs in runs.items()}
    save(args, "encode_gil_probe", {"config": {k: getattr(args, k) for k in ("model", "bits", "dtype", "doc_chars",
                                                                              "chat_chars", "chat_tokens", "docs_per_s",
                                                                              "chunk_size", "repeats")},
                                    "encode_ms": encode_ms, "runs": runs, "summary": summary})
    for m, s in summary.items():
        log(m, f"medians: chat ITL p99 alone {s['solo_itl_p99_ms']:.1f} ms, beside the posts {s['itl_p99_ms']:.1f} ms "
               f"(p50 {s['itl_p50_ms']:.1f}, max {s['itl_max_ms']:.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
