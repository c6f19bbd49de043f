"""``mlxlab bench soak``: one ``mlxlab serve`` process on loopback under the seed-001 scene and a
seeded fault mix for a while, watched for 5xx, lost requests and leaks.

The server (:func:`mlxlab.studies.serving.against.server_command`, with ``--max-in-flight``) is
started as :class:`~mlxlab.studies.serving.against.Server` does (its own process group, stopped
by its id also when the run fails) and warmed up with a short scene. Then, until ``minutes`` are
up or ``max_requests`` were sent: one streaming chat after another (tenant ``chat``), ``workers``
clients posting documents back to back (``batch``), and a fault from
:class:`~mlxlab.studies.serving.soak_faults.FaultGenerator` every ``fault_gap_s`` seconds on
average (exponential gaps, seeded). Every ``sample_s`` seconds the server is sampled: its
``/metrics`` (requests admitted, finished by reason and in flight, KV bytes held, MLX active,
cache and peak memory) and ``/proc/<pid>`` (RSS, open fds, threads).

After the load: the server must drain to 0 in flight and 0 KV bytes, and its memory must come
back (:mod:`mlxlab.studies.serving.soak_verdict` states the tolerances). A final phase opens a few
streams and sends SIGTERM at a seeded random moment among them: the process must exit 0 and each
open stream end with a finish reason and ``[DONE]``. Last, with the server gone, a seeded sample
of the finished well-formed requests is run again on a fresh in-process engine (same model,
dtype, policy and chunk size; greedy), and their token ids compared. Importing this module loads
no MLX.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional

from mlxlab.studies.serving.against import STARTUP_S, Server, _free_port, scene, server_command, stream, text
from mlxlab.studies.serving.soak_faults import FAULTS, FaultGenerator, run_fault, stream_record
from mlxlab.studies.serving.soak_verdict import counts, end_checks, per_minute

NEAR_TIE = 1e-4  # a top-two log-probability gap below this may part a batched greedy stream from a lone one (tests/oracle.py)
DRAIN_S = 120.0  # how long the load may take to drain after the clients stop


def model_context(model: str) -> int:
    """The context length of a preset or a model directory, from its config (no MLX)."""
    from mlxlab.core.presets import available_presets, model_limits, preset_config

    cfg = preset_config(model) if model in available_presets() else json.loads((Path(model) / "config.json").read_text())
    return model_limits(cfg)[1]


# ----------------------------------------------------------------------------- sampling the server
def probe(url: str, pid: Optional[int]) -> Dict:
    """One sample of the server: ``/metrics`` and ``/proc/<pid>`` (see the module docstring)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    out: Dict = {"t": time.perf_counter()}
    try:
        body = httpx.get(url + "/metrics", timeout=60.0).text
    except httpx.HTTPError as e:
        out["error"] = f"{type(e).__name__}: {e}"
        body = ""
    fam: Dict[str, list] = {}
    for f in text_string_to_metric_families(body):
        for s in f.samples:
            fam.setdefault(s.name, []).append((s.labels, s.value))

    def one(name):
        v = fam.get(name)
        return None if not v else v[0][1]

    reasons: Dict[str, float] = {}
    for labels, v in fam.get("mlxlab:request_success_total", []):
        reasons[labels.get("finished_reason", "?")] = reasons.get(labels.get("finished_reason", "?"), 0) + v
    out.update(in_flight=one("mlxlab:num_requests_in_flight"), kv_bytes=one("mlxlab:kv_cache_usage_bytes"),
               admitted=one("mlxlab:requests_admitted_total"), finished=sum(reasons.values()),
               by_reason=reasons, server_cancelled=reasons.get("cancelled", 0.0),
               active_bytes=one("mlxlab:memory_active_bytes"), cache_bytes=one("mlxlab:memory_cache_bytes"),
               peak_bytes=one("mlxlab:memory_peak_bytes"), rss_bytes=one("process_resident_memory_bytes"),
               fds=one("process_open_fds"), threads=one("mlxlab:process_threads"))
    out.update(_proc(pid))  # the server's own /proc where this machine has one (the same figures, read from outside)
    return out


def _proc(pid: Optional[int]) -> Dict:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        return {"rss_bytes": int(fields["VmRSS"].split()[0]) * 1024, "threads": int(fields["Threads"]),
                "fds": len(os.listdir(f"/proc/{pid}/fd"))}
    except (OSError, KeyError, ValueError):
        return {}


def wait_drained(url: str, pid: int, timeout_s: float = DRAIN_S) -> Dict:
    """Sample until nothing is in flight (or ``timeout_s``), then once more a moment later."""
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        s = probe(url, pid)
        if s.get("in_flight") == 0:
            break
        time.sleep(0.5)
    time.sleep(1.0)
    return probe(url, pid)


# ----------------------------------------------------------------------------- the load
def _client_loop(kind: str, url: str, model: str, chars: int, tokens: int, user: str, rng: random.Random,
                 stop: threading.Event, out: List[Dict]) -> None:
    import httpx

    with httpx.Client(timeout=STARTUP_S) as client:
        while not stop.is_set():
            out.append(stream_record(kind, stream(client, url, model, text(chars, rng), tokens, user=user), tokens))
            if out[-1]["status"] == 429:  # a well-behaved client waits as Retry-After says (1 s)
                stop.wait(1.0)


def _fault_loop(gen: FaultGenerator, url: str, model: str, ctx: int, gap_s: float, rng: random.Random,
                stop: threading.Event, out: List[Dict], drawn: Dict[str, int]) -> None:
    while not stop.wait(rng.expovariate(1.0 / gap_s)):
        f = gen.next()
        drawn[f["kind"]] = drawn.get(f["kind"], 0) + 1
        out.extend(run_fault(f, url, model, ctx))


def _sampler(url: str, pid: int, every_s: float, stop: threading.Event, out: List[Dict]) -> None:
    while not stop.wait(every_s):
        out.append(probe(url, pid))


def sigterm_phase(url: str, model: str, proc, rng: random.Random, *, streams: int, chars: int, tokens: int) -> Dict:
    """Open ``streams`` streams, SIGTERM the server at a random moment among them, and say how it
    ended: its exit code and seconds to exit, and per stream whether it ended with a finish
    reason and ``[DONE]`` (``clean``: exit 0 and every accepted stream so)."""
    import httpx

    recs: List[Dict] = []

    def one(p: str) -> None:
        with httpx.Client(timeout=STARTUP_S) as c:
            recs.append(stream_record("sigterm", stream(c, url, model, p, tokens, user="chat"), tokens))

    threads = [threading.Thread(target=one, args=(text(chars, rng),), daemon=True) for _ in range(streams)]
    for t in threads:
        t.start()
    delay = rng.uniform(0.5, 3.0)
    time.sleep(delay)
    t0 = time.perf_counter()
    os.kill(proc.pid, signal.SIGTERM)
    try:
        code = proc.wait(timeout=60)
    except Exception:  # noqa: BLE001 - reported as not exited; the Server context kills it
        code = None
    exit_s = time.perf_counter() - t0
    for t in threads:
        t.join(60)
    accepted = [r for r in recs if r["status"] == 200]
    ends = {}
    for r in accepted:
        k = "finished" if r["outcome"] == "finished" else "cut"
        ends[k] = ends.get(k, 0) + 1
    return {"after_s": delay, "exit_code": code, "exit_s": exit_s, "streams": streams, "accepted": len(accepted),
            "ended": ends, "tokens_before_end": [len(r["ids"]) for r in accepted],
            "http_5xx": sum(r["outcome"] == "server_error" for r in recs),
            "clean": code == 0 and all(r["outcome"] == "finished" for r in accepted)
            and not any(r["outcome"] == "server_error" for r in recs)}


# ----------------------------------------------------------------------------- greedy outputs
def compare_outputs(model: str, samples: List[Dict], *, dtype: Optional[str], policy: str, chunk_size: int) -> Dict:
    """Run each sampled request alone on a fresh in-process engine (greedy) and compare token ids;
    where they part, whether mlx-lm's greedy run has a near-tie (top-two gap < NEAR_TIE) at or
    before that step (then float32 rounding may part them; the test oracle's rule)."""
    from mlxlab import Engine, load_model
    from mlxlab.serve.text import tokenizer_for

    m, tok = load_model(model, dtype=dtype), tokenizer_for(model)
    rows = []
    with Engine(m, policy=policy, chunk_size=chunk_size) as eng:
        for s in samples:
            ids = tok.encode(s["prompt"])
            req = eng.submit(ids, s["max_tokens"], stop_tokens=tok.eos_token_ids, temperature=0.0)
            eng.run()
            out = list(req.output_tokens)
            row = {"kind": s["kind"], "prompt_tokens": len(ids), "tokens": len(s["ids"]), "equal": out == s["ids"]}
            if not row["equal"]:
                d = next((i for i, (a, b) in enumerate(zip(out, s["ids"])) if a != b), min(len(out), len(s["ids"])))
                row.update(first_difference=d, near_tie_at=_first_near_tie(m, ids, s["max_tokens"]))
                row["explained"] = row["near_tie_at"] <= d
            rows.append(row)
    return {"compared": len(rows), "identical": sum(r["equal"] for r in rows),
            "equal": bool(rows) and all(r["equal"] or r.get("explained") for r in rows), "rows": rows,
            "dtype": str(m.dtype), "rule": "token ids equal, or parting only at or after a near-tie of mlx-lm's greedy "
                                           f"top-two log-probabilities (gap < {NEAR_TIE:g})"}


def _first_near_tie(m, prompt: List[int], max_tokens: int) -> int:
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    for i, (_, logprobs) in enumerate(generate_step(mx.array(prompt), m.module, max_tokens=max_tokens)):
        top2 = mx.topk(logprobs, 2)
        if float(mx.abs(top2[0] - top2[1]).item()) < NEAR_TIE:
            return i
    return max_tokens


# ----------------------------------------------------------------------------- the run
def soak(model: str, *, minutes: float, max_requests: int = 100000, seed: int = 0, max_in_flight: int = 8,
         workers: int = 2, chat_chars: int = 256, chat_tokens: int = 64, doc_chars: int = 1024, doc_tokens: int = 8,
         policy: str = "slo", chunk_size: int = 512, dtype: Optional[str] = None, fault_gap_s: float = 2.0,
         sample_s: float = 5.0, interval_s: float = 60.0, sample_outputs: int = 12, sigterm_streams: int = 4,
         log_dir: str = ".", progress: bool = True) -> Dict:
    """The soak (see the module docstring); returns the results document (its verdict apart)."""
    rng = random.Random(f"soak {seed}")
    port, ctx = _free_port(), model_context(model)
    cmd = server_command("mlxlab", model, port, policy=policy, prefill_step=chunk_size) + [
        "--max-in-flight", str(max_in_flight)] + (["--dtype", dtype] if dtype else [])
    srv = Server(cmd, port, os.path.join(log_dir, "server_soak.log"))
    records: List[Dict] = []
    samples: List[Dict] = []
    drawn: Dict[str, int] = {}
    with srv as url:
        pid = srv.proc.pid
        scene(url, model, chat_chars=min(chat_chars, 128), chat_tokens=8, doc_chars=min(doc_chars, 512), doc_tokens=2,
              workers=workers, seed=-1)  # warm-up (its requests are not counted)
        warm = wait_drained(url, pid)
        stop = threading.Event()
        threads = [threading.Thread(target=_sampler, args=(url, pid, sample_s, stop, samples), daemon=True),
                   threading.Thread(target=_client_loop, daemon=True, args=(
                       "chat", url, model, chat_chars, chat_tokens, "chat", random.Random(f"chat {seed}"), stop, records)),
                   threading.Thread(target=_fault_loop, daemon=True, args=(
                       FaultGenerator(seed, prompt_chars=max(doc_chars, 512), max_in_flight=max_in_flight), url, model,
                       ctx, fault_gap_s, random.Random(f"fault gaps {seed}"), stop, records, drawn))]
        threads += [threading.Thread(target=_client_loop, daemon=True, args=(
            "document", url, model, doc_chars, doc_tokens, "batch", random.Random(f"documents {seed} {w}"), stop,
            records)) for w in range(workers)]
        t0 = time.perf_counter()
        samples.append({**warm, "t": t0})
        for t in threads:
            t.start()
        deadline, shown = t0 + 60.0 * minutes, 0
        while time.perf_counter() < deadline and len(records) < max_requests:
            time.sleep(0.25)
            if progress and time.perf_counter() - t0 >= (shown + 1) * interval_s:
                shown += 1
                last = samples[-1]
                print(f"[bench soak] minute {shown}: {len(records)} requests, {counts(records)['http_5xx']} 5xx, "
                      f"RSS {(last.get('rss_bytes') or 0) / 2 ** 20:.0f} MiB, KV {(last.get('kv_bytes') or 0) / 2 ** 20:.1f}"
                      f" MiB, in flight {last.get('in_flight')}", flush=True)
        stop.set()
        for t in threads:
            t.join(STARTUP_S)
        t1 = time.perf_counter()
        after = wait_drained(url, pid)
        samples.append(after)
        end = end_checks(warm, after, samples, t0, t1, records)
        sig = sigterm_phase(url, model, srv.proc, rng, streams=sigterm_streams, chars=chat_chars,
                            tokens=4 * chat_tokens) if sigterm_streams else {}
    pool = [r for r in records if r.get("well_formed") and r["outcome"] == "finished" and r["ids"]]
    picked = random.Random(f"outputs {seed}").sample(pool, min(sample_outputs, len(pool)))
    outputs = compare_outputs(model, picked, dtype=dtype, policy=policy, chunk_size=chunk_size) if picked else {}
    name = os.path.basename(os.path.normpath(model)) if os.path.isdir(model) else model
    shown_cmd = [os.path.basename(cmd[0])] + [name if a == model else a for a in cmd[1:]]
    return {"config": {"model": name, "minutes": minutes, "max_requests": max_requests, "seed": seed,
                       "max_in_flight": max_in_flight, "workers": workers, "chat_chars": chat_chars,
                       "chat_tokens": chat_tokens, "doc_chars": doc_chars, "doc_tokens": doc_tokens, "policy": policy,
                       "chunk_size": chunk_size, "dtype": dtype, "fault_gap_s": fault_gap_s, "sample_s": sample_s,
                       "interval_s": interval_s, "max_context": ctx, "faults": list(FAULTS)},
            "command": shown_cmd, "duration_s": t1 - t0, "totals": counts(records), "faults_by_kind": drawn,
            "per_minute": per_minute(records, samples, t0, interval_s), "end": end, "sigterm": sig, "outputs": outputs,
            "warm": _plain(warm, t0), "after": _plain(after, t0),
            "samples": [_plain(s, t0) for s in samples]}


def _plain(s: Dict, t0: float) -> Dict:
    """A sample as stored: its time in seconds from the load's start."""
    return {"t_s": round(s["t"] - t0, 3), **{k: v for k, v in s.items() if k not in ("t", "by_reason")}}
