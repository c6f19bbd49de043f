"""Disaggregation measured (issue 21): the chat-beside-a-document workload on one engine against a
prefill worker and a decode worker (:mod:`mlxlab.engine.disagg`) in two processes over mlx's ring
backend on loopback.

The workload is the contention benchmark's (:mod:`mlxlab.studies.contention.run`): a chat of
``chat_context`` prompt tokens decodes; once it has ``WARM_TOKENS`` tokens a document of
``doc_tokens`` arrives (``doc_max_tokens`` tokens long, so its KV has a reader and travels); the
chat ends ``AFTER_TOKENS`` tokens after the document is done. Both settings run it in fresh
processes (:mod:`mlxlab.studies.disagg.worker`) launched alike, with the same threads in total
(:func:`threads_by_setting`: ``threads`` OpenBLAS threads per worker process, and the one engine
the two workers' sum), so the split is not handed a second core the single engine lacks; each
process runs it ``rounds``
times on fresh engines and the last round (warm: every shape met) is measured. The ``repeats``
alternate the settings, so drift in a shared machine hits both alike.

Per run: the chat's ITL p50/p99 over its gaps overlapping [document arrival, document first
token] (contention's window), both requests' greedy tokens (as the decode side read them), the
document's TTFT (on the disaggregated side as the decode worker reads the first token, and as
the prefill worker computed it), per prompt the KV bytes and transfer seconds (the prefill
worker's send start to the decode worker's receipt, one host clock), and throughput per
device: every prompt and output token over the run's span (first arrival to last finish) and the
number of processes, with each process's busy share (its steps' seconds over the span), and the
CPU seconds each process spent in the round (``time.process_time``: every thread's, mlx's ring
threads too), which a machine shared with other work does not inflate as it inflates wall time.

Importing this module loads no MLX: everything that does runs in the launched processes.
"""

from __future__ import annotations

import json
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from mlxlab.studies.contention.run import AFTER_TOKENS, WARM_TOKENS, pct

#: setting -> how it runs: on one engine (``local``), or disaggregated with mlx's ring threads waiting
#: at idle priority (:class:`mlxlab.engine.disagg_wire.Comms`) or busy-polling as mlx leaves them
SETTINGS = {"single": {"local": True, "busy_wait": False}, "disagg": {"local": False, "busy_wait": False},
            "disagg-busywait": {"local": False, "busy_wait": True},
            # two independent engines, the chat on one and the document on the other: no KV moves
            # (the no-disaggregation baseline with the same devices: on two GPUs, one each)
            "split": {"local": False, "busy_wait": False, "split": True}}
TIMEOUT_S = 600  # a launched run that takes longer is stopped (it hangs: a rank died mid-protocol)


def worker_env(threads: int = 1, env: Optional[dict] = None) -> dict:
    """The launched processes' environment: this one's, OpenBLAS preloaded on Linux
    (:func:`mlxlab.core.environment.fast_blas_env`) and ``threads`` OpenBLAS threads each (mlx's
    CPU backend runs a stream's work on one thread; OpenBLAS adds its own), ``PYTHONPATH``
    leading with this checkout so the workers import this ``mlxlab``."""
    from mlxlab.core.environment import fast_blas_env

    out = fast_blas_env(env)
    out["OPENBLAS_NUM_THREADS"] = str(int(threads))
    root = str(Path(__file__).resolve().parents[2])
    out["PYTHONPATH"] = os.pathsep.join(x for x in (root, out.get("PYTHONPATH", "")) if x)
    return out


def threads_by_setting(threads: int) -> Dict[str, int]:
    """OpenBLAS threads per process of each setting at ``threads`` per worker: the one engine gets
    what the two workers have together, so both sides hold the same threads on the same cores."""
    return {s: (2 * int(threads) if how["local"] else int(threads)) for s, how in SETTINGS.items()}


def _run_pair(cmds: List[List[str]], env: dict, timeout_s: float, what: str) -> None:
    """Two processes at once (the split setting), both stopped at ``timeout_s``; an error names the
    one that failed."""
    procs = [subprocess.Popen(c, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd=str(Path(__file__).resolve().parents[2])) for c in cmds]
    deadline = time.monotonic() + timeout_s
    try:
        outs = [p.communicate(timeout=max(1.0, deadline - time.monotonic())) for p in procs]
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{what} ran past {timeout_s:.0f} s and was stopped") from None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (_, err) in zip(procs, outs):
        if p.returncode != 0:
            raise RuntimeError(f"{what} failed (exit {p.returncode}): {err[-3000:]}")


def merge_split(chat: dict, doc: dict) -> dict:
    """The split setting's two files as one ``local``-shaped file: each round's requests on one
    clock (the earlier engine's start), the chat side's steps, both sides' CPU seconds."""
    rounds = []
    for a, b in zip(chat["rounds"], doc["rounds"]):
        t0 = min(a["t0_abs"], b["t0_abs"])
        reqs = {}
        for side in (a, b):
            shift = side["t0_abs"] - t0
            for i, r in side["requests"].items():
                reqs[i] = {**r, **{k: (None if r[k] is None else r[k] + shift) for k in ("arrival_s", "prefill_start_s",
                                                                                      "finish_s")},
                           "token_times_s": [t + shift for t in r["token_times_s"]]}
        steps = [{**st, "start_s": st["start_s"] + a["t0_abs"] - t0, "end_s": st["end_s"] + a["t0_abs"] - t0}
                 for st in a["steps"]]
        rounds.append({"requests": reqs, "steps": steps, "cpu_s": a["cpu_s"] + b["cpu_s"]})
    return {**chat, "role": "split", "rounds": rounds}


def free_port_pair(host: str = "127.0.0.1") -> int:
    """A port ``p`` with ``p`` and ``p + 1`` free on ``host`` now (the ring's two ranks listen on them)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind((host, 0))
            p = s.getsockname()[1]
        try:
            with socket.socket() as s:
                s.bind((host, p + 1))
            return p
        except OSError:
            continue
    raise RuntimeError(f"no two consecutive free ports on {host}")


def _worker_args(workload_path: Path, out: Path, model: str, dtype: str, policy: str, chunk_size: int,
                 rounds: int) -> List[str]:
    return [sys.executable, "-m", "mlxlab.studies.disagg.worker", "--workload", str(workload_path), "--out", str(out),
            "--model", model, "--dtype", dtype, "--policy", policy, "--chunk-size", str(chunk_size),
            "--rounds", str(rounds)]


def _idle_launcher() -> None:
    """In the launcher's process before it runs (Linux): ``SCHED_IDLE``. ``mlx.launch`` forwards
    each rank's output on a thread whose ``select`` also waits for the rank's stdin to be
    writable, which it always is, so the threads spin: 1.2 of this machine's 2 cores in a
    disaggregated run. The ranks inherit the policy and set themselves back to ``SCHED_OTHER``
    first thing (:func:`mlxlab.studies.disagg.worker.main`), which nice 0 allows (sched(7))."""
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


def _run(cmd: List[str], env: dict, timeout_s: float, what: str, idle: bool = False) -> None:
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s,
                              cwd=str(Path(__file__).resolve().parents[2]),
                              preexec_fn=_idle_launcher if idle and hasattr(os, "SCHED_IDLE") else None)
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"{what} ran past {timeout_s:.0f} s and was stopped; its output ended: "
                           f"{(e.stderr or b'')[-2000:]!r}") from None
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {done.returncode}): {done.stderr[-3000:]}")


def launcher_command() -> List[str]:
    """How to start ``mlx.launch``: its console script beside this Python when pip installed
    mlx there, else the same entry point through this Python (mlx on ``PYTHONPATH``, as the
    H200's carried bundle is: it has the module but no script)."""
    script = Path(sys.executable).with_name("mlx.launch")
    if script.exists():
        return [str(script)]
    try:
        from mlx._distributed_utils import launch as _  # noqa: F401  (mlx's launcher module)
    except ImportError as e:
        raise RuntimeError(f"mlx.launch is not beside {sys.executable} and mlx._distributed_utils.launch does not "
                           f"import ({e}): install mlx (pip install mlx) in this environment") from None
    return [sys.executable, "-c", "import sys; from mlx._distributed_utils.launch import main; sys.exit(main())"]


def launch(workload: List[dict], out: Path, *, model: str = "tiny", dtype: str = "float32", policy: str = "interleave",
           chunk_size: int = 512, rounds: int = 1, local: bool = False, threads: int = 1,
           busy_wait: bool = False, split: bool = False, bits: Optional[int] = None, gpus: bool = False,
           timeout_s: float = TIMEOUT_S) -> Dict[str, dict]:
    """Run ``workload`` in fresh processes: with ``local`` one engine (``local.json``); with
    ``split`` two independent engines at once, the chat's tenant on one and the rest on the other
    (``split-chat.json``, ``split-doc.json``, returned merged as ``local``-shaped ``split``); else
    the two ranks under ``mlx.launch --backend ring -n 2`` on loopback (``rank0.json``,
    ``rank1.json``) at a free port pair (``busy_wait``: mlx's ring threads left busy-polling);
    stopped after ``timeout_s``. ``gpus``: each process on its own GPU (the one engine on GPU 0,
    rank or split side r on GPU r). Returns the files' contents by name."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    wpath = out / "workload.json"
    wpath.write_text(json.dumps(workload))
    cmd = _worker_args(wpath, out, model, dtype, policy, chunk_size, rounds) + (["--bits", str(bits)] if bits else [])
    env = worker_env(threads)
    if local:
        _run(cmd + ["--local"] + (["--device", "0"] if gpus else []), env, timeout_s, "the single-engine run")
        return {"local": json.loads((out / "local.json").read_text())}
    if split:
        tenants = sorted({r.get("tenant", "default") for r in workload}, key=lambda t: t != "chat")
        if len(tenants) != 2:
            raise ValueError(f"the split setting needs two tenants in the workload, not {tenants}")
        _run_pair([cmd + ["--split-tenant", t, "--signals", str(out / "signals")] + (["--device", str(d)] if gpus else [])
                   for d, t in enumerate(tenants)], env, timeout_s, "the split run (two independent engines)")
        files = [json.loads((out / f"split-{t}.json").read_text()) for t in tenants]
        return {"split": merge_split(*files)}
    port = free_port_pair()
    cmd += ["--busy-wait"] if busy_wait else []
    cmd += ["--device-by-rank"] if gpus else []
    _run(launcher_command() + ["--backend", "ring", "--hosts", "127.0.0.1", "-n", "2", "-p", str(port), "--"] + cmd,
         env, timeout_s, "the disaggregated run (mlx.launch, ring backend)", idle=True)
    return {f"rank{r}": json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)}


# ----------------------------------------------------------------------------- the workload and its figures


def contention_workload(vocab_size: int, chat_context: int, doc_tokens: int, doc_max_tokens: int = 8,
                        chat_max_tokens: int = 4096, seed: int = 0) -> List[dict]:
    """The contention benchmark's chat and document as a disaggregation workload (module
    docstring); prompts as :func:`mlxlab.engine.warmup.random_prompt` draws them (no MLX here)."""
    import random

    def prompt(n, s):
        rng = random.Random(s)
        return [rng.randrange(1, vocab_size) for _ in range(n)]

    return [{"prompt": prompt(chat_context, seed), "max_tokens": chat_max_tokens, "tenant": "chat",
             "until": [1, AFTER_TOKENS]},
            {"prompt": prompt(doc_tokens, seed + 1), "max_tokens": doc_max_tokens, "tenant": "doc",
             "after": [0, WARM_TOKENS]}]


def _busy(steps: List[dict], t0: float, t1: float) -> float:
    """Seconds inside [t0, t1] covered by at least one of ``steps`` (pipelined decode steps overlap:
    a step's record ends when its tokens are read, after the next step was queued)."""
    total, end = 0.0, t0
    for a, b in sorted((max(s["start_s"], t0), min(s["end_s"], t1)) for s in steps):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def run_figures(files: Dict[str, dict]) -> dict:
    """One run's figures from its last round (see the module docstring)."""
    decode = files.get("local") or files.get("split") or files["rank1"]
    last = decode["rounds"][-1]
    reqs = last["requests"]
    chat, doc = reqs["0"], reqs["1"]
    t_doc, t_first = doc["arrival_s"], doc["token_times_s"][0]
    tt = chat["token_times_s"]
    window = [b - a for a, b in zip(tt, tt[1:]) if b > t_doc and a < t_first]
    before = [b - a for a, b in zip(tt, tt[1:]) if b <= t_doc][1:]  # the first gap joins the batch
    span0 = min(r["arrival_s"] for r in reqs.values())
    span1 = max(r["finish_s"] for r in reqs.values())
    tokens = sum(r["prompt_tokens"] + len(r["output_tokens"]) for r in reqs.values())
    devices = 1 if "local" in files else 2
    side = "single" if devices == 1 else "split" if "split" in files else "decode"  # split: the chat side's steps
    busy = {side: _busy(last["steps"], span0, span1) / (span1 - span0)}
    out = {"chat_itl_p50_ms": 1e3 * pct(window, 50), "chat_itl_p99_ms": 1e3 * pct(window, 99),
           "chat_worst_gap_ms": 1e3 * max(window) if window else float("nan"),
           "chat_itl_before_doc_p50_ms": 1e3 * pct(before, 50), "doc_ttft_s": t_first - t_doc,
           "span_s": span1 - span0, "tokens": tokens, "devices": devices,
           "tokens_per_s_per_device": tokens / (span1 - span0) / devices, "busy_share": busy,
           "gaps_ms": [round(1e3 * g, 3) for g in window], "chat_tokens": len(tt),
           "output_tokens": {"chat": chat["output_tokens"], "doc": doc["output_tokens"]},
           "env": decode.get("env"), "blas": decode.get("blas"),
           "ring_wait_duty_cycle_s": decode.get("ring_wait_duty_cycle_s")}
    cpu = {side: last["cpu_s"]}
    out["cpu_s"] = cpu
    if "rank0" in files:
        pre = files["rank0"]["rounds"][-1]
        busy["prefill"] = _busy(pre["steps"], span0, span1) / (span1 - span0)
        cpu["prefill"] = pre["cpu_s"]
        doc_pre = pre["requests"]["1"]
        out["doc_ttft_prefill_side_s"] = doc_pre["token_times_s"][0] - doc_pre["arrival_s"]
        out["transfers"] = {i: {**pre["sent"][i], **{k: v for k, v in last["received"][i].items()
                                                     if k in ("received_s", "transfer_s")}} for i in pre["sent"]}
        out["doc_kv_bytes"] = pre["sent"]["1"]["kv_bytes"]
        out["doc_transfer_s"] = last["received"]["1"]["transfer_s"]
        out["chat_kv_bytes"] = pre["sent"]["0"]["kv_bytes"]
        out["chat_transfer_s"] = last["received"]["0"]["transfer_s"]
    out["cpu_s_total"] = sum(cpu.values())
    out["tokens_per_cpu_s"] = tokens / out["cpu_s_total"]
    return out


def _stats(xs: Sequence[float]) -> dict:
    xs = [float(x) for x in xs if x is not None and math.isfinite(float(x))]
    if not xs:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan"), "n": 0}
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


SUMMARY_KEYS = ("chat_itl_p50_ms", "chat_itl_p99_ms", "chat_worst_gap_ms", "chat_itl_before_doc_p50_ms", "doc_ttft_s",
                "doc_ttft_prefill_side_s", "doc_kv_bytes", "doc_transfer_s", "chat_kv_bytes", "chat_transfer_s",
                "tokens_per_s_per_device", "span_s", "cpu_s_total", "tokens_per_cpu_s")


def summarize(runs: Dict[str, List[dict]]) -> dict:
    """Per setting: median, min and max over the repeats of each figure, the chat's ITL pooled
    over every repeat's window, and the busy shares' medians."""
    out = {}
    for name, rs in runs.items():
        gaps = [g for r in rs for g in r["gaps_ms"]]
        row = {k: _stats([r.get(k) for r in rs]) for k in SUMMARY_KEYS if any(k in r for r in rs)}
        row["pooled"] = {"chat_itl_p50_ms": pct(gaps, 50), "chat_itl_p99_ms": pct(gaps, 99), "gaps": len(gaps)}
        row["busy_share"] = {k: _stats([r["busy_share"][k] for r in rs]) for k in rs[0]["busy_share"]}
        row["cpu_s"] = {k: _stats([r["cpu_s"][k] for r in rs]) for k in rs[0]["cpu_s"]}
        out[name] = row
    return out


def run_study(*, model: str = "small", dtype: str = "float32", doc_tokens: int = 2048, chat_context: int = 256,
              doc_max_tokens: int = 8, chunk_size: int = 512, policy: str = "interleave", repeats: int = 3,
              rounds: int = 2, threads: int = 1, seed: int = 0, progress: bool = True,
              settings: Sequence[str] = ("single", "disagg"), timeout_s: float = TIMEOUT_S,
              bits: Optional[int] = None, gpus: bool = False) -> dict:
    """The study (module docstring): ``repeats`` x ``settings`` (of :data:`SETTINGS`), each in
    fresh processes of ``rounds`` rounds. Returns a JSON-ready dict: ``summary`` (:func:`summarize`),
    ``runs`` (setting -> every repeat's :func:`run_figures`), ``config``, ``load`` (``os.getloadavg``
    before each run: the shared machine's state) and ``wall_s``. ``bits``: the preset's weights
    quantized; ``gpus``: each process on a GPU of its own (:func:`launch`)."""
    from mlxlab.core.presets import model_limits, preset_config

    vocab, _ = model_limits(preset_config(model))
    workload = contention_workload(vocab, chat_context, doc_tokens, doc_max_tokens, seed=seed)
    bad = [x for x in settings if x not in SETTINGS]
    if bad or not settings:
        raise ValueError(f"unknown disaggregation setting(s) {bad or settings}; choose from {list(SETTINGS)}")
    runs: Dict[str, List[dict]] = {s: [] for s in settings}
    per_process = threads_by_setting(threads)
    load = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mlxlab-disagg-") as tmp:
        for rep in range(repeats):
            for setting in settings:
                load.append({"repeat": rep, "setting": setting, "loadavg": list(os.getloadavg())})
                files = launch(workload, Path(tmp) / f"{setting}-{rep}", model=model, dtype=dtype, policy=policy,
                               chunk_size=chunk_size, rounds=rounds, threads=per_process[setting], timeout_s=timeout_s,
                               bits=bits, gpus=gpus, **SETTINGS[setting])
                runs[setting].append(run_figures(files))
                if progress:
                    r = runs[setting][-1]
                    print(f"[disagg] repeat {rep + 1}/{repeats} {setting}: chat ITL p50 {r['chat_itl_p50_ms']:.1f} ms "
                          f"p99 {r['chat_itl_p99_ms']:.1f} ms, doc TTFT {r['doc_ttft_s']:.3f} s", flush=True)
    return {"summary": summarize(runs), "runs": runs, "load": load, "wall_s": time.perf_counter() - t0,
            "config": {"model": model, "dtype": dtype, "bits": bits, "gpus": gpus, "doc_tokens": doc_tokens, "chat_context": chat_context,
                       "doc_max_tokens": doc_max_tokens, "chunk_size": chunk_size, "policy": policy,
                       "repeats": repeats, "rounds": rounds, "openblas_threads_per_process": threads,
                       "openblas_threads_by_setting": {s: per_process[s] for s in settings},
                       "warm_tokens": WARM_TOKENS, "after_tokens": AFTER_TOKENS, "seed": seed,
                       "transport": "mx.distributed ring backend, send/recv, loopback (127.0.0.1), through host "
                                    "memory (mlx's NCCL backend has no send/recv)",
                       "decode_policy": "interleave", "cpu_count": os.cpu_count(), "settings": list(settings),
                       "launcher": "mlx.launch at SCHED_IDLE (its output threads spin), ranks reset to SCHED_OTHER"}}


def format_table(res: dict) -> str:
    """The summary as text: medians [min-max] over the repeats."""
    def cell(row, k, scale=1.0, fmt="{:.1f}"):
        s = row.get(k)
        if not s or not s["n"]:
            return "-"
        return (fmt + " [" + fmt + "-" + fmt + "]").format(scale * s["median"], scale * s["min"], scale * s["max"])

    lines = []
    for name, row in res["summary"].items():
        lines.append(f"{name}: chat ITL p50 {cell(row, 'chat_itl_p50_ms')} ms, p99 {cell(row, 'chat_itl_p99_ms')} ms "
                     f"(pooled p99 {row['pooled']['chat_itl_p99_ms']:.1f}); doc TTFT "
                     f"{cell(row, 'doc_ttft_s', fmt='{:.3f}')} s; tokens/s/device "
                     f"{cell(row, 'tokens_per_s_per_device', fmt='{:.0f}')}; CPU s {cell(row, 'cpu_s_total')}, tokens per CPU s "
                     f"{cell(row, 'tokens_per_cpu_s', fmt='{:.0f}')}")
        if "doc_kv_bytes" in row:
            lines.append(f"  doc KV {cell(row, 'doc_kv_bytes', 1 / 2**20, '{:.2f}')} MiB in "
                         f"{cell(row, 'doc_transfer_s', 1e3)} ms; chat KV {cell(row, 'chat_kv_bytes', 1 / 2**20, '{:.2f}')}"
                         f" MiB in {cell(row, 'chat_transfer_s', 1e3)} ms; doc TTFT at the prefill worker "
                         f"{cell(row, 'doc_ttft_prefill_side_s', fmt='{:.3f}')} s")
    return "\n".join(lines)
