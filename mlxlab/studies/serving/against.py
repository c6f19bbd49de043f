"""``mlxlab serve`` against ``mlx_lm.server`` over HTTP: the seed-001 scene, each server in a
process of its own on the same model directory (``mlxlab bench http``).

A model directory both servers load (``mlxlab export-model``: one token per ASCII character, so
a prompt of N characters is N tokens on both) is served by one server at a time on loopback. For
each: a warm-up (:func:`warm_up`), then per repeat a streaming chat alone (its solo ITL), and then chats of
the same shape one after another for at least ``window_s`` seconds while ``workers`` clients post
documents back to back (each a streaming completion, so its first token time is seen). The window
is the same on every server and ends with its last chat: a server whose chat streams fast is not
measured over a shorter stretch than one whose chat crawls (with a single chat as the window, a
server that finished the chat before any document could not count one). Each SSE chunk is stamped as it arrives; its text length is its number of
tokens (the character tokenizer), so a chunk carrying several tokens counts them all and its gap
is split evenly between them, as the client saw them arrive together. Per server: the chat's ITL
p50/p99/max alone and under the documents, its tokens per second during them, documents finished
per minute, document TTFT p50/p90, tokens per chunk and errors. Every server process is stopped
by its own id, also when a run fails. Importing this module loads no MLX.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

#: the servers this study can start, and how (``{model}``, ``{port}`` and options filled in)
SERVERS = ("mlx-lm", "mlxlab")
STARTUP_S = 600.0  # loading and warming a model may take this long before the server answers


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(kind: str, model_dir: str, port: int, *, policy: str = "slo", prefill_step: int = 2048,
                   options: Sequence[str] = (), record: Optional[str] = None) -> List[str]:
    """The command line that serves ``model_dir`` on ``port``: ``mlx_lm.server`` with its prefill
    step set to ``prefill_step`` (the one knob the two share), or ``mlxlab serve`` with ``policy``
    and the same chunk size (recording its trace to ``record``, when given) and its tokenizer
    processes as this host's default (:func:`mlxlab.serve.encode.auto_processes`), named so the
    stored command says which ran."""
    if kind == "mlx-lm":
        return [sys.executable, "-m", "mlx_lm.server", "--model", model_dir, "--host", "127.0.0.1", "--port",
                str(port), "--prefill-step-size", str(prefill_step)]
    if kind == "mlxlab":
        from mlxlab.serve.encode import auto_processes  # no MLX

        cmd = [sys.executable, "-m", "mlxlab.cli", "serve", "--model", model_dir, "--host", "127.0.0.1", "--port",
               str(port), "--policy", policy, "--chunk-size", str(prefill_step), "--log-level", "warning",
               "--tokenizer-processes", str(auto_processes())]
        for o in options:
            cmd += ["--policy-option", o]
        return cmd + (["--record", record] if record else [])
    raise ValueError(f"unknown server {kind!r}: choose from {SERVERS}")


def policy_variant(spec: str, prefill_step: int) -> Tuple[str, int, List[str]]:
    """A ``--policies`` entry as ``(policy, chunk size, --policy-option items)``: a policy name
    alone (``slo``), or with ``:KEY=VALUE`` settings (``slo:chunk_size=1024:itl_target_x=1.5``), so
    one run can set a policy's levers beside each other. ``chunk_size`` is ``mlxlab serve
    --chunk-size`` (mlx_lm.server keeps ``prefill_step``); every other key is a policy option.
    Raises ValueError on a setting without ``=`` or a chunk size that is not a positive integer."""
    name, *items = spec.split(":")
    if not name:
        raise ValueError(f"a --policies entry needs a policy name first (e.g. slo:chunk_size=1024), got {spec!r}")
    chunk, options = prefill_step, []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise ValueError(f"{spec!r}: each setting after the policy is KEY=VALUE (e.g. slo:chunk_size=1024), "
                             f"got {item!r}")
        if key == "chunk_size":
            if not value.isdigit() or int(value) < 1:
                raise ValueError(f"{spec!r}: chunk_size must be a positive integer, got {value!r}")
            chunk = int(value)
        else:
            options.append(f"{key}={value}")
    return name, chunk, options


class Server:
    """One server process, started and stopped by its id (``with Server(...) as url``)."""

    def __init__(self, cmd: List[str], port: int, log_path: str):
        self.cmd, self.port, self.log_path, self.proc = cmd, port, log_path, None

    def __enter__(self) -> str:
        import httpx

        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        url, t0 = f"http://127.0.0.1:{self.port}", time.perf_counter()
        while time.perf_counter() - t0 < STARTUP_S:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited (code {self.proc.returncode}) before answering; its log: "
                                   f"{open(self.log_path).read()[-2000:]}")
            try:
                if httpx.get(url + "/v1/models", timeout=2.0).status_code == 200:
                    return url
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"the server did not answer on {url} within {STARTUP_S:.0f} s")

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # its own session: the server and any child it started
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=20)
        self._log.close()


def stream(client, url: str, model: str, prompt: str, max_tokens: int, user: Optional[str] = None) -> Dict:
    """One streaming completion: ``sent``, per chunk its arrival and token count (its ``token_ids``
    where the server sends them, mlxlab's extension, else its text's length), ``error``; also the
    HTTP ``status``, an error body's ``error_code``, the ``ids`` streamed, the ``finish_reason``
    and whether ``[DONE]`` came (``done_seen``), and the ``prompt``. ``user``: the OpenAI ``user``
    field, which mlxlab serve takes as the tenant (a recorded trace then knows the chat from the
    documents; mlx_lm.server ignores it)."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True, "temperature": 0.0}
    if user:
        body["user"] = user
    out = {"sent": time.perf_counter(), "arrivals": [], "tokens": [], "error": None, "status": None,
           "error_code": None, "ids": [], "finish_reason": None, "done_seen": False, "prompt": prompt}
    try:
        with client.stream("POST", url + "/v1/completions", json=body) as r:
            out["status"] = r.status_code
            if r.status_code != 200:
                raw = r.read()
                out["error"], out["error_code"] = f"HTTP {r.status_code}: {raw[:200]!r}", error_code(raw)
                return out
            for line in r.iter_lines():
                if line.strip() == "data: [DONE]":
                    out["done_seen"] = True
                if not line.startswith("data:") or line.strip() == "data: [DONE]":
                    continue
                choice = json.loads(line[5:])["choices"][0]
                ids = choice.get("token_ids") or []
                out["ids"] += ids
                out["finish_reason"] = choice.get("finish_reason") or out["finish_reason"]
                n = len(ids) or len(choice.get("text") or "")
                if n:
                    out["arrivals"].append(time.perf_counter())
                    out["tokens"].append(n)
    except Exception as e:  # noqa: BLE001 - a failed request is a measured outcome, kept with its reason
        out["error"] = f"{type(e).__name__}: {e}"
    return out


def error_code(raw: bytes) -> Optional[str]:
    """The ``code`` (else ``type``) of an OpenAI-style error body, or None."""
    try:
        err = json.loads(raw)["error"]
        return str(err.get("code") or err.get("type"))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def token_gaps(run: Dict) -> List[float]:
    """The gaps between tokens as the client saw them: each chunk's gap split evenly over its tokens."""
    gaps, prev = [], None
    for t, n in zip(run["arrivals"], run["tokens"]):
        if prev is not None:
            gaps += [(t - prev) / n] * n
        prev = t
    return gaps


def _pct(xs: Sequence[float], p: float) -> Optional[float]:
    return float(np.percentile(xs, p)) if len(xs) else None


_LETTERS = "abcdefghijklmnopqrstuvwxyz     "


def text(chars: int, rng) -> str:
    """A fresh random text of ``chars`` characters (as many tokens): every prompt differs, so no
    server's prompt cache serves one from an earlier request."""
    return "".join(rng.choice(_LETTERS) for _ in range(chars))


def _document_worker(client, url, model, doc_chars: int, doc_tokens: int, stop: threading.Event, out: List[Dict],
                     rng) -> None:
    while not stop.is_set():
        r = stream(client, url, model, text(doc_chars, rng), doc_tokens, user="batch")
        r["done"] = time.perf_counter()
        out.append(r)


def scene(url: str, model: str, *, chat_chars: int, chat_tokens: int, doc_chars: int, doc_tokens: int, workers: int,
          seed: int = 0, lead_s: float = 1.0, window_s: float = 0.0) -> Dict:
    """The chat alone, then chats one after another for at least ``window_s`` seconds (at least
    one) beside ``workers`` document clients (started ``lead_s`` before the first); every prompt a
    fresh random text (:func:`text`), the same ones for every server at one ``seed``."""
    import random

    import httpx

    rng = random.Random(f"scene {seed}")
    with httpx.Client(timeout=STARTUP_S) as client:
        solo = stream(client, url, model, text(chat_chars, rng), chat_tokens, user="chat")
        stop, docs = threading.Event(), []
        threads = [threading.Thread(target=_document_worker, daemon=True,
                                    args=(client, url, model, doc_chars, doc_tokens, stop, docs,
                                          random.Random(f"documents {seed} {w}"))) for w in range(workers)]
        for t in threads:
            t.start()
        time.sleep(lead_s)
        chats, until = [], time.perf_counter() + window_s
        while not chats or (time.perf_counter() < until and not chats[-1]["error"]):
            chats.append(stream(client, url, model, text(chat_chars, rng), chat_tokens, user="chat"))
        stop.set()
        for t in threads:
            t.join(timeout=STARTUP_S)
    return _figures(solo, chats, docs)


LONGEST_GAPS = 20  # the contended chats' longest gaps kept with where they fell


def longest_gaps(chats: List[Dict], k: int = LONGEST_GAPS) -> List[Dict]:
    """The ``k`` longest gaps of the contended chats, each with its chat and its place in it
    (``gap`` 0: between the chat's first and second token), longest first: whether a p99 comes
    from one moment of every chat (its first gaps, as it joins the decode batch) or from any."""
    gaps = [token_gaps(c) for c in chats]
    per = [(i, j, g) for i, gs in enumerate(gaps) for j, g in enumerate(gs)]
    return [{"chat": i, "gap": j, "of": len(gaps[i]), "ms": g * 1e3} for i, j, g in sorted(per, key=lambda x: -x[2])[:k]]


def _figures(solo: Dict, chats: List[Dict], docs: List[Dict]) -> Dict:
    """The scene's figures; the window runs from the first chat's request to its last chat's
    last token, the ITL gaps are pooled within the chats (a new chat's first token is its TTFT)."""
    g_solo = token_gaps(solo)
    g_tog = [g for c in chats for g in token_gaps(c)]
    start = chats[0]["sent"]
    last = chats[-1]
    end = last["arrivals"][-1] if last["arrivals"] else time.perf_counter()
    span = max(end - start, 1e-9)
    finished = [d for d in docs if not d["error"] and start <= d["done"] <= end]
    ttft = [d["arrivals"][0] - d["sent"] for d in docs if d["arrivals"]]
    chunks = [n for c in chats for n in c["tokens"]] or [0]
    streamed = sum(sum(c["tokens"][1:]) for c in chats)  # tokens after each chat's first
    return {"solo_itl_p50_ms": _ms(_pct(g_solo, 50)), "solo_itl_p99_ms": _ms(_pct(g_solo, 99)),
            "chat_itl_p50_ms": _ms(_pct(g_tog, 50)), "chat_itl_p99_ms": _ms(_pct(g_tog, 99)),
            "chat_itl_max_ms": _ms(max(g_tog) if g_tog else None),
            "chat_ttft_p50_ms": _ms(_pct([c["arrivals"][0] - c["sent"] for c in chats if c["arrivals"]], 50)),
            "chats": len(chats), "window_s": span,
            "chat_tok_s_during": streamed / span if any(c["tokens"] for c in chats) else None,
            "docs_per_min": 60.0 * len(finished) / span, "docs_finished": len(finished), "docs_started": len(docs),
            "doc_ttft_p50_s": _pct(ttft, 50), "doc_ttft_p90_s": _pct(ttft, 90),
            "tokens_per_chunk": statistics.mean(chunks), "longest_gaps": longest_gaps(chats),
            "errors": [d["error"] for d in [solo, *chats, *docs] if d["error"]][:5]}


def _ms(x) -> Optional[float]:
    return None if x is None else 1e3 * x


def summarize(runs: List[Dict]) -> Dict:
    """Per figure the median over the repeats with its min and max."""
    out = {}
    for k in runs[0]:
        vals = [r[k] for r in runs if isinstance(r.get(k), (int, float)) and r.get(k) is not None]
        if vals and k != "errors":
            out[k] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}
    out["errors"] = sorted({e for r in runs for e in r.get("errors", [])})
    return out


WARM_CHAT_CHARS, WARM_CHAT_TOKENS, WARM_DOC_CHARS = 200, 16, 1000  # the warm-up's short scene (at most)
WARM_UP = (f"one chat of the timed shape alone, then a short scene (chats of {WARM_CHAT_CHARS} characters and "
           f"{WARM_CHAT_TOKENS} tokens beside documents of {WARM_DOC_CHARS:,})")


def warm_up(url: str, model: str, *, chat_chars: int, chat_tokens: int, doc_chars: int, workers: int) -> None:
    """Before the timed repeats (:data:`WARM_UP`): a chat of the timed shape alone, so the first
    repeat's solo chat is not the first decode at its context length (on an H100 the first repeat's
    solo ITL p99 was 1.05-2.2x the second's on all five servers after a warm-up of short prompts only),
    then a short contended scene."""
    import random

    import httpx

    with httpx.Client(timeout=STARTUP_S) as client:
        stream(client, url, model, text(chat_chars, random.Random("warm-up")), chat_tokens, user="chat")
    scene(url, model, chat_chars=min(chat_chars, WARM_CHAT_CHARS), chat_tokens=WARM_CHAT_TOKENS,
          doc_chars=min(doc_chars, WARM_DOC_CHARS), doc_tokens=2, workers=workers, seed=-1)


def against_mlx_lm(model_dir: str, *, policies: Sequence[str] = ("slo",), workers: int = 4, chat_chars: int = 1500,
                   chat_tokens: int = 300, doc_chars: int = 16000, doc_tokens: int = 8, repeats: int = 2,
                   prefill_step: int = 2048, window_s: float = 60.0, log_dir: str = ".",
                   record_dir: Optional[str] = None, progress: bool = True,
                   on_server: Optional[Callable[[Dict], None]] = None) -> Dict:
    """The scene on ``mlx_lm.server`` and on ``mlxlab serve`` under each of ``policies``, one server
    at a time, each with a warm-up (:func:`warm_up`) first. Every prompt is a fresh random text, the same
    ones on every server, so no prompt cache serves a document (mlx_lm.server keeps one). Returns per server the runs,
    their summary and its command line. ``on_server``, when given, is called with the result so far after each
    server (a run cut short by a time limit keeps the servers that finished)."""
    for p in policies:  # a malformed variant is refused before any server runs
        policy_variant(p, prefill_step)
    name = os.path.basename(os.path.normpath(model_dir))
    config = {"model_dir": name, "policies": list(policies), "workers": workers, "chat_chars": chat_chars,
              "chat_tokens": chat_tokens, "doc_chars": doc_chars, "doc_tokens": doc_tokens, "repeats": repeats,
              "prefill_step": prefill_step, "window_s": window_s,
              "tokenizer": "one token per ASCII character (mlxlab export-model)",
              "prompts": "fresh random text per request, the same on every server", "warm_up": WARM_UP}
    out = {}
    for kind, policy in [("mlx-lm", None)] + [("mlxlab", p) for p in policies]:
        label = "mlx_lm.server" if kind == "mlx-lm" else f"mlxlab {policy}"
        port = _free_port()
        safe = (policy or "").replace(":", "_").replace("=", "-")
        rec = (os.path.join(record_dir, f"serve_http_{name}_{safe}.jsonl") if record_dir and kind == "mlxlab"
               else None)
        if rec and os.path.exists(rec):
            os.remove(rec)  # this run's trace only (the recorder appends)
        if kind == "mlxlab":  # a variant (slo:chunk_size=1024) runs its policy with those settings
            pname, chunk, opts = policy_variant(policy, prefill_step)
            cmd = server_command(kind, model_dir, port, policy=pname, prefill_step=chunk, options=opts, record=rec)
        else:
            cmd = server_command(kind, model_dir, port, prefill_step=prefill_step)
        with Server(cmd, port, os.path.join(log_dir, f"server_{label.replace(' ', '_')}.log")) as url:
            model = model_dir  # both servers name the model by its directory
            warm_up(url, model, chat_chars=chat_chars, chat_tokens=chat_tokens, doc_chars=doc_chars, workers=workers)
            runs = []
            for r in range(repeats):
                runs.append(scene(url, model, chat_chars=chat_chars, chat_tokens=chat_tokens, doc_chars=doc_chars,
                                  doc_tokens=doc_tokens, workers=workers, seed=r, window_s=window_s))
                if progress:
                    x = runs[-1]
                    print(f"[bench http] {label} repeat {r + 1}/{repeats}: chat ITL p99 solo "
                          f"{x['solo_itl_p99_ms'] or float('nan'):.1f} ms, beside {workers} documents "
                          f"{x['chat_itl_p99_ms'] or float('nan'):.1f} ms; {x['docs_per_min']:.1f} documents/min "
                          f"over {x['window_s']:.0f} s ({x['chats']} chats)" + "".join(
                              f"; longest gap {g['ms']:.0f} ms, gap {g['gap']} of {g['of']}" for g in
                              x["longest_gaps"][:1]), flush=True)
        shown = [name if a == model_dir else os.path.basename(a) if a == rec else a for a in cmd[1:]]  # no machine paths
        out[label] = {"runs": runs, "summary": summarize(runs), "command": [os.path.basename(cmd[0])] + shown,
                      "model_name": name, **({"trace": os.path.basename(rec)} if rec else {})}
        if on_server is not None:
            on_server({"servers": dict(out), "config": config})
    return {"servers": out, "config": config}


# ----------------------------------------------------------------------------- verdicts
ITL_X = 2.0  # the chat's ITL p99 beside the documents over its solo p99, at most
THROUGHPUT_SHARE = 0.9  # ... at no less than this share of the best documents/min any server reached


def _fig(s: Dict, k: str, which: str = "median") -> float:
    v = (s.get(k) or {}).get(which)
    return float("nan") if v is None else float(v)


def _mlxlab(servers: Dict) -> Dict[str, Dict]:
    return {k: v["summary"] for k, v in servers.items() if k.startswith("mlxlab") and not failed(v)}


def failed(server: Dict) -> List[str]:
    """The errors a server's requests met (an HTTP error or an exception while streaming), in any repeat: a
    server that failed requests is not measured by its figures (its documents/min count the
    requests that happened to finish before it broke)."""
    return sorted({e for r in server.get("runs") or [] for e in r.get("errors") or []}
                  | set((server.get("summary") or {}).get("errors") or []))


def _failures(servers: Dict) -> Dict[str, List[str]]:
    return {k: failed(v)[:3] for k, v in servers.items() if failed(v)}


FAILED_RULE = (" A server whose requests failed in any repeat (an HTTP error or an exception while streaming) is left out: its "
               "figures count only what finished before it broke.")


def _fair(doc: Dict) -> str:
    c = doc.get("config", {})
    return (f"Both servers on the same model directory ({c.get('model_dir')}, one token per character, so a "
            f"{c.get('doc_chars')}-character document is that many tokens on each), one at a time on loopback, the "
            f"same prefill step ({c.get('prefill_step')}) where mlx_lm.server takes one; {c.get('workers')} document "
            f"clients posting back to back beside a {c.get('chat_chars')}-token chat streaming {c.get('chat_tokens')} "
            f"tokens" + (f", chats one after another for at least {c['window_s']:g} s (the window documents/min "
                         f"counts over)" if c.get("window_s") else ", one chat (the window documents/min counts over)")
            + f"; {c.get('repeats')} repeat(s) after a warm-up round, min and max over them kept. What is not "
            f"matched: mlx_lm.server batches prompts its own way (--prompt-concurrency, its prompt cache), mlxlab by "
            f"its policy.")


def throughput_verdict(doc: Dict) -> Dict:
    """``mlx-serve-vs-mlxlm-throughput``: mlxlab's best policy finishes at least as many documents
    per minute as mlx_lm.server beside the same chat; inconclusive where their repeats overlap."""
    from mlxlab.core.claims import verdict

    servers = doc.get("servers") or {}
    ref = (servers.get("mlx_lm.server") or {}).get("summary")
    ours = _mlxlab(servers)
    rule = ("Documents finished per minute while the chat streams, median over repeats: mlxlab's best policy "
            "against mlx_lm.server. Reproduced when its median is at least mlx_lm.server's and its lowest repeat "
            "above mlx_lm.server's highest; not reproduced when its highest repeat is below mlx_lm.server's "
            "lowest; inconclusive when the repeats overlap." + FAILED_RULE)
    broken = _failures(servers)
    if not ref or not ours or "mlx_lm.server" in broken:
        return verdict("mlx-serve-vs-mlxlm-throughput", "not measured", measured={"failed": broken} if broken else None,
                       rule=rule, fairness=_fair(doc))
    best = max(ours, key=lambda k: _fig(ours[k], "docs_per_min"))
    b, r = ours[best], ref
    measured = {"best_policy": best, "docs_per_min_mlxlab": _fig(b, "docs_per_min"),
                "docs_per_min_mlx_lm": _fig(r, "docs_per_min"),
                "ratio_x": _fig(b, "docs_per_min") / _fig(r, "docs_per_min") if _fig(r, "docs_per_min") else None,
                "doc_ttft_p50_s_mlxlab": _fig(b, "doc_ttft_p50_s"), "doc_ttft_p50_s_mlx_lm": _fig(r, "doc_ttft_p50_s")}
    if _fig(b, "docs_per_min", "max") < _fig(r, "docs_per_min", "min"):
        v = "not reproduced"
    elif _fig(b, "docs_per_min", "min") > _fig(r, "docs_per_min", "max"):
        v = "reproduced"
    else:
        v = "inconclusive"
    measured["within_noise"] = v == "inconclusive"
    if broken:
        measured["failed"] = broken
    return verdict("mlx-serve-vs-mlxlm-throughput", v, measured=measured, rule=rule, fairness=_fair(doc))


def chat_verdict(doc: Dict) -> Dict:
    """``mlx-serve-chat-itl``: over HTTP, an mlxlab policy keeps the chat's ITL p99 within ITL_X of
    its solo p99 beside the documents while finishing at least THROUGHPUT_SHARE of the best
    documents/min any server reached."""
    from mlxlab.core.claims import verdict

    servers = doc.get("servers") or {}
    ours = _mlxlab(servers)
    rule = (f"Per mlxlab policy, the chat's ITL p99 beside the documents over its solo ITL p99 (medians over "
            f"repeats), among the policies finishing at least {THROUGHPUT_SHARE:.0%} of the best documents/min any "
            f"server reached (mlx_lm.server's included). Reproduced when one has a ratio of at most {ITL_X:g} in "
            f"every repeat; inconclusive when the best one's repeats straddle {ITL_X:g}; not reproduced otherwise."
            + FAILED_RULE)
    broken = _failures(servers)
    if not ours:
        return verdict("mlx-serve-chat-itl", "not measured", measured={"failed": broken} if broken else None,
                       rule=rule, fairness=_fair(doc))
    top = max(_fig(v["summary"], "docs_per_min") for k, v in servers.items() if k not in broken)
    ratios = {}
    for k, s in ours.items():
        runs = [r for r in servers[k]["runs"] if r.get("chat_itl_p99_ms") and r.get("solo_itl_p99_ms")]
        ratios[k] = [r["chat_itl_p99_ms"] / r["solo_itl_p99_ms"] for r in runs]
    eligible = {k: x for k, x in ratios.items() if x and _fig(ours[k], "docs_per_min") >= THROUGHPUT_SHARE * top}
    measured = {"itl_p99_over_solo_x": {k: statistics.median(x) for k, x in ratios.items() if x},
                "docs_per_min": {k: _fig(v["summary"], "docs_per_min") for k, v in servers.items()},
                "eligible": sorted(eligible), **({"failed": broken} if broken else {})}
    if not eligible:
        return verdict("mlx-serve-chat-itl", "not reproduced", measured=measured, fairness=_fair(doc),
                       rule=rule + f" No mlxlab policy reached {THROUGHPUT_SHARE:.0%} of the best documents/min.")
    best = min(eligible, key=lambda k: statistics.median(eligible[k]))
    x = eligible[best]
    v = "reproduced" if max(x) <= ITL_X else ("inconclusive" if min(x) <= ITL_X else "not reproduced")
    measured.update(best_policy=best, best_ratio_min_x=min(x), best_ratio_max_x=max(x), within_noise=v == "inconclusive")
    return verdict("mlx-serve-chat-itl", v, measured=measured, rule=rule, fairness=_fair(doc))


def against_verdicts(doc: Dict) -> List[Dict]:
    return [throughput_verdict(doc), chat_verdict(doc)]
