"""Request traces: a user's own traffic in (``mlxlab serve --record``) and two public formats, read
into one shape the simulator and the engine replay.

A trace is a list of :class:`TraceRequest`: when a request arrived, from which tenant, how long its
prompt was, which fixed-size prompt blocks it shared with others (a chain of block hashes, so a
shared prefix survives and the text does not), how many tokens it asked for and produced, and, for
a recorded trace, its TTFT and ITL as served. Three formats, told apart by :func:`read_trace`:

* ``mlxlab`` (JSONL, written by ``mlxlab serve --record FILE``, one line per finished request):
  ``arrival_s`` (Unix seconds), ``tenant``, ``prompt_tokens``, ``block_tokens``, ``block_hashes``
  (a hash per full block, each covering the block and every block before it), ``max_tokens``,
  ``produced_tokens``, ``ttft_s``, ``itl_p50_s``, ``itl_p99_s``, ``finish_reason``. Lines come in
  the order requests finished; the reader sorts them by arrival.
* ``mooncake`` (JSONL, the FAST'25 Mooncake traces): ``timestamp`` (milliseconds from the first
  request), ``input_length``, ``output_length``, ``hash_ids`` (one id per 512-token block; equal ids
  are equal blocks).
* ``azure`` (CSV, the Azure LLM inference traces 2023/2024): ``TIMESTAMP`` (a date and time),
  ``ContextTokens``, ``GeneratedTokens``; no prefix information.

A bad trace is refused with :class:`TraceError`, which names the file, the line and what to fix:
an empty file, a line that does not parse, a missing or non-integer length, a negative length,
arrival times out of order (in the public formats), a prompt over the model's context. :func:`to_arrivals` turns a trace
into :class:`mlxlab.core.workload.Arrival` objects with token ids: a block hash always gives the
same tokens, so requests that shared a prefix share it again in the replay (the prefix cache sees
it), and the rest of a prompt is fresh per request.

No MLX import: the simulator and the tests read traces without a model.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import random
import threading
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

FORMATS = ("mlxlab", "mooncake", "azure")
MOONCAKE_BLOCK = 512  # tokens per hash id in the Mooncake traces
RECORD_BLOCK = 256  # tokens per hashed block in a recorded trace (mlx-lm's KV cache grows by 256)


class TraceError(ValueError):
    """A trace that cannot be replayed: ``path``, ``line`` (1-based, None for the whole file) and
    the message, which says what to fix."""

    def __init__(self, path, line: Optional[int], message: str):
        self.path, self.line = str(path), line
        super().__init__(f"{path}{f', line {line}' if line else ''}: {message}")


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace. ``arrival_s``: seconds from the trace's first request."""

    arrival_s: float
    tenant: str
    prompt_tokens: int
    max_tokens: int
    block_hashes: Tuple = ()
    block_tokens: int = MOONCAKE_BLOCK
    produced_tokens: Optional[int] = None
    ttft_s: Optional[float] = None
    itl_p50_s: Optional[float] = None
    itl_p99_s: Optional[float] = None


@dataclass
class Trace:
    """A trace read from ``path`` in ``format``; ``notes`` lists what the reader changed."""

    requests: List[TraceRequest]
    format: str
    path: str = ""
    notes: List[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def duration_s(self) -> float:
        return self.requests[-1].arrival_s if self.requests else 0.0

    def tenants(self) -> Dict[str, int]:
        out: Dict[str, int] = {}
        for r in self.requests:
            out[r.tenant] = out.get(r.tenant, 0) + 1
        return out

    def summary(self) -> dict:
        """What the trace holds, for a results file: requests per tenant, span, prompt and output lengths."""
        p = sorted(r.prompt_tokens for r in self.requests)
        o = sorted(r.max_tokens for r in self.requests)
        shared = sum(1 for r in self.requests if r.block_hashes)
        return {"format": self.format, "path": Path(self.path).name if self.path else "", "requests": len(self),
                "tenants": self.tenants(), "duration_s": self.duration_s,
                "prompt_tokens": {"min": p[0], "median": p[len(p) // 2], "max": p[-1]},
                "max_tokens": {"min": o[0], "median": o[len(o) // 2], "max": o[-1]},
                "requests_with_block_hashes": shared, "notes": list(self.notes)}


# ------------------------------------------------------------------------------ block hashes
def block_hashes(tokens: Sequence[int], block_tokens: int = RECORD_BLOCK) -> List[int]:
    """A hash per full block of ``tokens``, each over the block and the hash before it (so equal
    hashes mean equal prefixes up to that block, as a prefix cache keys them): 63-bit integers."""
    if block_tokens < 1:
        raise ValueError(f"block_tokens must be at least 1, got {block_tokens}")
    out, prev = [], b""
    for i in range(len(tokens) // block_tokens):
        block = tokens[i * block_tokens:(i + 1) * block_tokens]
        h = hashlib.blake2b(prev + b"|" + ",".join(map(str, block)).encode(), digest_size=8).digest()
        out.append(int.from_bytes(h, "big") >> 1)
        prev = h
    return out


# ------------------------------------------------------------------------------ reading
def _int(path, line: int, row: dict, key: str, *, least: int = 0, what: str = "") -> int:
    if key not in row or row[key] in (None, ""):
        raise TraceError(path, line, f"no {key!r}: every request needs it{what}")
    v = row[key]
    try:
        n = int(v) if not isinstance(v, bool) and float(v) == int(float(v)) else None
    except (TypeError, ValueError):
        n = None
    if n is None:
        raise TraceError(path, line, f"{key} must be a whole number, got {v!r}")
    if n < least:
        raise TraceError(path, line, f"{key} must be at least {least}, got {n}")
    return n


def _float(path, line: int, row: dict, key: str) -> float:
    try:
        v = float(row[key])
    except (KeyError, TypeError, ValueError):
        raise TraceError(path, line, f"{key} must be a number, got {row.get(key)!r}") from None
    if v != v or v in (float("inf"), float("-inf")):
        raise TraceError(path, line, f"{key} must be a finite number, got {row.get(key)!r}")
    return v


def _opt(row: dict, key: str) -> Optional[float]:
    v = row.get(key)
    return None if v is None else float(v)


def _timestamp(path, line: int, text: str) -> float:
    """Seconds since the epoch of an Azure TIMESTAMP ("2023-11-16 18:15:46.6805900", up to 9
    fractional digits, an optional zone) or of a plain number of seconds."""
    s = str(text).strip()
    try:
        return float(s)
    except ValueError:
        pass
    head, dot, frac = s.partition(".")
    zone = ""
    if dot:
        digits = "".join(ch for ch in frac if ch.isdigit())
        zone = frac[len(digits):]
        frac = digits
    try:
        t = datetime.fromisoformat(head.replace("T", " ") + zone)
    except ValueError:
        raise TraceError(path, line, f"TIMESTAMP {text!r} is not a date and time like 2023-11-16 18:15:46.68") from None
    return t.timestamp() + (float("0." + frac) if frac else 0.0)


def _sniff(path: Path) -> str:
    if path.suffix.lower() == ".csv":
        return "azure"
    with open(path) as f:
        for n, raw in enumerate(f, 1):
            if raw.strip():
                try:
                    row = json.loads(raw)
                except json.JSONDecodeError as e:
                    raise TraceError(path, n, f"not JSON ({e.msg}); a trace is JSONL (one object a line) or "
                                               f"an Azure CSV") from None
                if isinstance(row, dict) and "input_length" in row:
                    return "mooncake"
                if isinstance(row, dict) and "prompt_tokens" in row:
                    return "mlxlab"
                raise TraceError(path, n, "neither an mlxlab record (prompt_tokens) nor a Mooncake line "
                                          "(input_length): pass format= to say which")
    raise TraceError(path, None, "the trace is empty: it holds no request")


def _jsonl(path: Path):
    with open(path) as f:
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
            except json.JSONDecodeError as e:
                raise TraceError(path, n, f"not JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise TraceError(path, n, f"a line must be a JSON object, got {type(row).__name__}")
            yield n, row


def _read_mlxlab(path: Path) -> List[Tuple[int, float, TraceRequest]]:
    out = []
    for n, row in _jsonl(path):
        hashes = row.get("block_hashes") or []
        if not isinstance(hashes, list):
            raise TraceError(path, n, "block_hashes must be a list of integers")
        out.append((n, _float(path, n, row, "arrival_s"), TraceRequest(
            0.0, str(row.get("tenant") or "default"), _int(path, n, row, "prompt_tokens", least=1),
            _int(path, n, row, "max_tokens", least=0), tuple(hashes),
            _int(path, n, {"b": row.get("block_tokens", RECORD_BLOCK)}, "b", least=1),
            None if row.get("produced_tokens") is None else _int(path, n, row, "produced_tokens"),
            _opt(row, "ttft_s"), _opt(row, "itl_p50_s"), _opt(row, "itl_p99_s"))))
    return out


def _read_mooncake(path: Path, tenant: str) -> List[Tuple[int, float, TraceRequest]]:
    out = []
    for n, row in _jsonl(path):
        hashes = row.get("hash_ids") or []
        if not isinstance(hashes, list) or not all(isinstance(h, int) for h in hashes):
            raise TraceError(path, n, "hash_ids must be a list of integers")
        out.append((n, _float(path, n, row, "timestamp") / 1000.0, TraceRequest(
            0.0, tenant, _int(path, n, row, "input_length", least=1), _int(path, n, row, "output_length", least=0),
            tuple(hashes), MOONCAKE_BLOCK)))
    return out


def _read_azure(path: Path, tenant: str) -> List[Tuple[int, float, TraceRequest]]:
    out = []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        need = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"}
        if reader.fieldnames is None:
            raise TraceError(path, None, "the trace is empty: it holds no request")
        if not need <= set(reader.fieldnames):
            raise TraceError(path, 1, f"an Azure trace's header has {', '.join(sorted(need))}; this one has "
                                      f"{', '.join(reader.fieldnames)}")
        for row in reader:
            n = reader.line_num
            out.append((n, _timestamp(path, n, row["TIMESTAMP"]), TraceRequest(
                0.0, tenant, _int(path, n, row, "ContextTokens", least=1), _int(path, n, row, "GeneratedTokens", least=0))))
    return out


def samples_dir() -> Path:
    """The committed trace samples (``data/traces/samples``)."""
    from mlxlab.core.paths import data_dir

    return data_dir() / "traces" / "samples"


def find_trace(path: Union[str, os.PathLike]) -> Path:
    """``path`` where it is a file, else, for a bare file name, the committed sample of that name
    (results store a trace by its name: their command lines rerun from any folder); else
    :class:`TraceError`."""
    p = Path(path)
    if p.is_file():
        return p
    sample = samples_dir() / p.name
    if p.name == str(path) and sample.is_file():
        return sample
    have = ", ".join(sorted(q.name for q in samples_dir().glob("*") if q.suffix in (".jsonl", ".csv")))
    raise TraceError(p, None, "no such file" + (f" (nor a committed sample of that name; the samples: {have})"
                                                if p.name == str(path) and have else ""))


def read_trace(path: Union[str, os.PathLike], format: str = "auto", *, max_context: Optional[int] = None,
               tenant: str = "trace", split_tokens: Optional[int] = None) -> Trace:
    """Read and check a trace (see the module docstring for the formats; ``auto`` tells them apart
    by the suffix and the first line). Arrival times become seconds from the first request; they
    must not go backwards. ``max_context``: refuse a prompt plus its tokens past the model's
    context. ``tenant``: the tenant of an imported trace's requests; ``split_tokens``: instead,
    requests with at least that many prompt tokens are ``batch`` and the rest ``chat`` (the
    seed-001 mix, where the public formats name no tenant). A recorded request is replayed asking
    for the tokens it produced (what it cost as served; a random-weight model never stops early);
    one asking for 0 tokens is replayed asking for 1 (counted in ``notes``)."""
    p = find_trace(path)
    fmt = _sniff(p) if format == "auto" else format
    if fmt not in FORMATS:
        raise ValueError(f"unknown trace format {format!r}; choose one of auto, {', '.join(FORMATS)}")
    rows = {"mlxlab": lambda: _read_mlxlab(p), "mooncake": lambda: _read_mooncake(p, tenant),
            "azure": lambda: _read_azure(p, tenant)}[fmt]()
    if not rows:
        raise TraceError(p, None, "the trace is empty: it holds no request")
    if fmt == "mlxlab":  # the recorder writes a request when it finishes: in arrival order once sorted
        rows.sort(key=lambda x: x[1])
    out, prev, zero = [], None, 0
    t0 = rows[0][1]
    for n, t, r in rows:
        if prev is not None and t < prev:
            raise TraceError(p, n, f"arrival time goes backwards ({t - t0:.3f} s after the first request, the line "
                                   f"before was at {prev - t0:.3f} s): sort the trace by arrival time")
        prev = t
        if max_context is not None and r.prompt_tokens + max(r.max_tokens, 1) > max_context:
            raise TraceError(p, n, f"the prompt ({r.prompt_tokens} tokens) and its {r.max_tokens} output tokens "
                                   f"exceed the model's context of {max_context}: drop the request, or scale the "
                                   f"trace's lengths down (length_scale)")
        if (r.produced_tokens or r.max_tokens) == 0:
            zero += 1
        ten = r.tenant if split_tokens is None else ("batch" if r.prompt_tokens >= split_tokens else "chat")
        asked = r.produced_tokens if r.produced_tokens else r.max_tokens  # a recorded request: what it cost
        out.append(TraceRequest(t - t0, ten, r.prompt_tokens, max(asked, 1), r.block_hashes, r.block_tokens,
                                r.produced_tokens, r.ttft_s, r.itl_p50_s, r.itl_p99_s))
    notes = [f"{zero} request(s) asked for 0 tokens: replayed asking for 1"] if zero else []
    return Trace(out, fmt, str(p), notes)


def scale_trace(trace: Trace, *, time_scale: float = 1.0, length_scale: float = 1.0) -> Trace:
    """The trace with arrival gaps times ``time_scale`` and token lengths times ``length_scale``
    (at least 1; blocks shrink with them, so shared prefixes stay shared): a datacenter trace
    brought to a laptop."""
    if not time_scale > 0 or not length_scale > 0:
        raise ValueError(f"scales must be above 0, got time_scale={time_scale}, length_scale={length_scale}")
    out = [TraceRequest(r.arrival_s * time_scale, r.tenant, max(1, round(r.prompt_tokens * length_scale)),
                        max(1, round(r.max_tokens * length_scale)), r.block_hashes,
                        max(1, round(r.block_tokens * length_scale)), r.produced_tokens, r.ttft_s, r.itl_p50_s,
                        r.itl_p99_s) for r in trace.requests]
    note = f"scaled: arrival gaps x{time_scale:g}, lengths x{length_scale:g}"
    return Trace(out, trace.format, trace.path, trace.notes + [note])


def scale_outputs(trace: Trace, factors: Dict[str, float]) -> Trace:
    """The trace with the requests of each tenant ``factors`` names asking for that many times their
    output tokens (at least 1), arrivals and prompts unchanged: a tenant whose tail percentile rests
    on a handful of gaps (a chat's ITL p99 over ~1,000 gaps is about its 10th largest:
    :func:`mlxlab.studies.tune.slo.support`) gets more of them. A tenant the trace lacks is refused."""
    have = {r.tenant for r in trace.requests}
    for t, f in factors.items():
        if t not in have:
            raise ValueError(f"output scale for tenant {t!r}: the trace's tenants are {sorted(have)}")
        if not f > 0 or f == float("inf"):
            raise ValueError(f"output scale for tenant {t!r} must be a finite number above 0, got {f}")
    out = [replace(r, max_tokens=max(1, round(r.max_tokens * factors[r.tenant])))
           if r.tenant in factors else r for r in trace.requests]
    note = "outputs scaled: " + ", ".join(f"{t} x{f:g}" for t, f in sorted(factors.items()))
    return Trace(out, trace.format, trace.path, trace.notes + [note])


def prepare_trace(path: Union[str, os.PathLike], format: str = "auto", *, split_tokens: Optional[int] = None,
                  time_scale: float = 1.0, length_scale: float = 1.0, output_scale: Optional[Dict[str, float]] = None,
                  max_requests: Optional[int] = None) -> Trace:
    """:func:`read_trace` then, in this order, :func:`scale_trace`, :func:`scale_outputs` and the first
    ``max_requests``: the trace as ``mlxlab tune`` replays it from its stored parameters (one order, so
    a probe rebuilding a stored tune's trace gets the requests tune ran)."""
    trace = read_trace(path, format, max_context=None, split_tokens=split_tokens)
    if time_scale != 1.0 or length_scale != 1.0:
        trace = scale_trace(trace, time_scale=time_scale, length_scale=length_scale)
    if output_scale:
        trace = scale_outputs(trace, output_scale)
    if max_requests:
        trace.requests = trace.requests[:max_requests]
    return trace


# ------------------------------------------------------------------------------ replaying
def _block(h, block_tokens: int, vocab_size: int) -> List[int]:
    rng = random.Random(f"block {h} {block_tokens}")
    return [rng.randrange(1, vocab_size) for _ in range(block_tokens)]


def prompt_for(req: TraceRequest, index: int, vocab_size: int, seed: int = 0) -> List[int]:
    """Token ids for ``req``: its hashed blocks (the same tokens for the same hash, in any request),
    then fresh tokens to its length (seeded by ``seed`` and ``index``)."""
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be at least 2, got {vocab_size}")
    toks: List[int] = []
    for h in req.block_hashes:
        if len(toks) >= req.prompt_tokens:
            break
        toks += _block(h, req.block_tokens, vocab_size)
    rng = random.Random(f"trace {seed} request {index}")
    toks = toks[:req.prompt_tokens]
    return toks + [rng.randrange(1, vocab_size) for _ in range(req.prompt_tokens - len(toks))]


def to_arrivals(trace: Trace, vocab_size: int, seed: int = 0) -> list:
    """The trace as :class:`mlxlab.core.workload.Arrival` objects (open loop, no follow-ups), for
    :class:`mlxlab.core.workload.TraceWorkload`."""
    from mlxlab.core.workload import Arrival  # the workload module imports nothing of this one

    keys: Dict[str, int] = {}
    out = []
    for i, r in enumerate(trace.requests):
        keys[r.tenant] = keys.get(r.tenant, -1) + 1
        out.append(Arrival(r.arrival_s, r.tenant, 0, prompt_for(r, i, vocab_size, seed), r.max_tokens, keys[r.tenant]))
    return out


# ------------------------------------------------------------------------------ recording
class TraceRecorder:
    """Appends one ``mlxlab`` trace line per finished request to ``path`` (``mlxlab serve
    --record``); thread-safe, flushed per line so a stopped server loses none. ``offset_s`` turns
    the engine's clock into Unix seconds."""

    def __init__(self, path: Union[str, os.PathLike], offset_s: float, block_tokens: int = RECORD_BLOCK):
        self.path = Path(path)
        if self.path.is_dir():
            raise ValueError(f"--record {self.path} is a folder: give a file (FILE.jsonl)")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.offset_s, self.block_tokens = offset_s, block_tokens
        self._f = open(self.path, "a", buffering=1)
        self._lock = threading.Lock()
        self.written = 0

    def line(self, req) -> dict:
        """The record of a finished engine :class:`mlxlab.core.request.Request`."""
        gaps = sorted(req.itl_s)
        pct = (lambda q: gaps[min(len(gaps) - 1, int(q * len(gaps)))]) if gaps else (lambda q: None)
        rec = TraceRequest(self.offset_s + req.arrival_s, req.tenant, req.prompt_tokens, req.max_tokens,
                           tuple(block_hashes(req.prompt, self.block_tokens)), self.block_tokens,
                           len(req.output_tokens), req.ttft_s, pct(0.5), pct(0.99))
        return {**asdict(rec), "block_hashes": list(rec.block_hashes), "finish_reason": req.finish_reason}

    def write(self, req) -> None:
        text = json.dumps(self.line(req), separators=(",", ":"))
        with self._lock:
            if not self._f.closed:
                self._f.write(text + "\n")
                self.written += 1

    def close(self) -> None:
        with self._lock:
            self._f.close()


def write_trace(path: Union[str, os.PathLike], requests: Iterable[TraceRequest], start_s: float = 0.0) -> Path:
    """Write requests in the ``mlxlab`` format (``arrival_s`` = ``start_s`` + their own)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "w") as f:
        for r in requests:
            d = asdict(r)
            d["arrival_s"] = start_s + r.arrival_s
            d["block_hashes"] = list(r.block_hashes)
            f.write(json.dumps(d, separators=(",", ":")) + "\n")
    return p
