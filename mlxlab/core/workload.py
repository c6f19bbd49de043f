"""Workloads: who sends which prompts when. Tenants, arrival processes, presets and trace files.

Two kinds of tenant, after the seed-001 case study:

* :class:`ChatTenant`: interactive sessions. Each turn re-sends the whole conversation so far
  (previous prompt + the model's previous answer + the new user/tool tokens), so a session is
  one long prefix that grows turn by turn. The next turn arrives ``think_time_s`` after the
  previous answer finished (closed loop within a session).
* :class:`BatchTenant`: benchmark workers sending fresh long prompts that share nothing.
  ``arrival="closed"``: ``workers`` workers each send their next prompt when their previous one
  finished; ``arrival="poisson"``: open loop, arrival times drawn up front.

A :class:`Workload` produces :class:`Arrival` objects: ``start()`` gives the first ones and
``on_finish(arrival, output_tokens, finish_s)`` gives the follow-ups of a finished request.
Times are seconds from the start of the run. Token ids are drawn uniformly from
``[1, vocab_size)``; every random draw comes from a ``random.Random`` seeded by the workload seed
and the draw's identity (tenant, session or request number, turn), so a seed fixes every prompt
and every arrival time no matter in which order requests finish.

Traces: the arrivals a run actually submitted, one JSON object per line (JSONL) under
``data/traces/``; :class:`TraceWorkload` replays one open loop.

No MLX import: the simulator and tests use this module without a model.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

from mlxlab.core.paths import data_dir

Length = Union[int, Tuple[int, int]]  # a fixed token count, or an inclusive range drawn uniformly
Seconds = Union[float, Tuple[float, float]]  # a fixed time, or a range drawn uniformly


@dataclass
class Arrival:
    """One request a tenant sends: at ``time_s`` (seconds from run start), from stream ``key``
    (chat session or batch worker number) of ``tenant``. ``index`` is the request's number in
    its stream: the chat turn (0-based) or the batch tenant's question number."""

    time_s: float
    tenant: str
    key: int
    prompt: List[int]
    max_tokens: int
    index: int = 0

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt)

    def as_dict(self) -> dict:
        return {"time_s": self.time_s, "tenant": self.tenant, "key": self.key, "index": self.index,
                "max_tokens": self.max_tokens, "prompt": list(self.prompt)}

    @classmethod
    def from_dict(cls, d: dict) -> "Arrival":
        return cls(time_s=float(d["time_s"]), tenant=str(d["tenant"]), key=int(d["key"]),
                   prompt=[int(t) for t in d["prompt"]], max_tokens=int(d["max_tokens"]),
                   index=int(d.get("index", 0)))


# ---------------------------------------------------------------------------------- tenants
def _check_length(name: str, v: Length) -> None:
    lo, hi = (v, v) if isinstance(v, int) else tuple(v)
    if not (isinstance(lo, int) and isinstance(hi, int) and 0 < lo <= hi):
        raise ValueError(f"{name} must be a positive int or a (lo, hi) range with 0 < lo <= hi, got {v!r}")


def _check_arrival(arrival: str, rate_per_s: Optional[float]) -> None:
    if arrival not in ("closed", "poisson"):
        raise ValueError(f"arrival must be 'closed' or 'poisson', got {arrival!r}")
    if arrival == "poisson" and not (rate_per_s and rate_per_s > 0):
        raise ValueError("poisson arrivals need rate_per_s > 0")


@dataclass
class ChatTenant:
    """Interactive multi-turn sessions (a person or an agent loop waiting on every token).

    ``sessions`` sessions of ``turns`` turns each. Turn 0 sends ``first_prompt_tokens`` tokens;
    turn n+1 sends turn n's prompt + its output + ``turn_tokens`` new tokens, ``think_time_s``
    after turn n finished. Sessions start at ``start_s + i * stagger_s``, or, with
    ``arrival="poisson"``, at Poisson times of rate ``rate_per_s`` from ``start_s``."""

    sessions: int = 1
    turns: int = 4
    first_prompt_tokens: Length = 512
    turn_tokens: Length = 64
    output_tokens: Length = 32
    think_time_s: Seconds = 1.0
    start_s: float = 0.0
    stagger_s: float = 0.0
    arrival: str = "closed"
    rate_per_s: Optional[float] = None
    name: str = "chat"

    def __post_init__(self):
        if self.sessions < 1 or self.turns < 1:
            raise ValueError("a chat tenant needs sessions >= 1 and turns >= 1")
        for f in ("first_prompt_tokens", "turn_tokens", "output_tokens"):
            _check_length(f, getattr(self, f))
        think = (self.think_time_s,) * 2 if isinstance(self.think_time_s, (int, float)) else tuple(self.think_time_s)
        if not 0 <= think[0] <= think[1]:
            raise ValueError(f"think_time_s must be >= 0 or a (lo, hi) range, got {self.think_time_s!r}")
        _check_arrival(self.arrival, self.rate_per_s)

    @property
    def total_requests(self) -> int:
        return self.sessions * self.turns


@dataclass
class BatchTenant:
    """Benchmark-style work: ``requests`` fresh prompts in total (shared by the workers), each of
    ``prompt_tokens`` tokens, nobody watching the stream.

    ``arrival="closed"``: ``workers`` workers start at ``start_s + w * stagger_s`` and each sends
    its next prompt ``gap_s`` after its previous one finished (0 = immediately).
    ``arrival="poisson"``: the prompts arrive open loop at Poisson times of rate ``rate_per_s``
    from ``start_s``; ``key`` is then ``index % workers``, for labelling only."""

    workers: int = 1
    requests: int = 8
    prompt_tokens: Length = (1024, 2048)
    output_tokens: Length = 16
    start_s: float = 0.0
    arrival: str = "closed"
    rate_per_s: Optional[float] = None
    gap_s: float = 0.0
    stagger_s: float = 0.0
    name: str = "batch"

    def __post_init__(self):
        if self.workers < 1 or self.requests < 0:
            raise ValueError("a batch tenant needs workers >= 1 and requests >= 0")
        for f in ("prompt_tokens", "output_tokens"):
            _check_length(f, getattr(self, f))
        _check_arrival(self.arrival, self.rate_per_s)

    @property
    def total_requests(self) -> int:
        return self.requests


Tenant = Union[ChatTenant, BatchTenant]


# ---------------------------------------------------------------------------------- workload
def _draw_length(rng: random.Random, v: Length) -> int:
    return v if isinstance(v, int) else rng.randint(v[0], v[1])


def _draw_time(rng: random.Random, v: Seconds) -> float:
    return float(v) if isinstance(v, (int, float)) else rng.uniform(v[0], v[1])


def _poisson_times(rng: random.Random, start_s: float, rate_per_s: float, n: int) -> List[float]:
    """``n`` arrival times of a Poisson process of rate ``rate_per_s`` from ``start_s``."""
    t, out = start_s, []
    for _ in range(n):
        t += rng.expovariate(rate_per_s)
        out.append(t)
    return out


class Workload:
    """Tenants plus a seed: the arrivals of one run.

    Args:
        tenants: :class:`ChatTenant` / :class:`BatchTenant` objects with distinct names.
        vocab_size: token ids are drawn from ``[1, vocab_size)`` (use the model's vocabulary).
        seed: fixes every prompt, length and arrival time.
        max_context: if set, a chat session ends early instead of sending a turn whose prompt
            plus ``max_tokens`` would exceed it (an engine rejects such a request).
        name: a label recorded with results.

    Call :meth:`start` to begin (it resets all state, so a workload can be run again), then
    :meth:`on_finish` for each finished request."""

    def __init__(self, tenants: Sequence[Tenant], vocab_size: int, seed: int = 0, *,
                 max_context: Optional[int] = None, name: Optional[str] = None):
        self.tenants = list(tenants)
        names = [t.name for t in self.tenants]
        if len(set(names)) != len(names):
            raise ValueError(f"tenant names must be distinct, got {names}")
        if not isinstance(vocab_size, int) or vocab_size < 2:
            raise ValueError(f"vocab_size must be an int >= 2, got {vocab_size!r}")
        self.vocab_size = vocab_size
        self.seed = seed
        self.max_context = max_context
        self.name = name or "+".join(names)
        self._by_name: Dict[str, Tenant] = {t.name: t for t in self.tenants}
        self._next_question: Dict[str, int] = {}

    # -------------------------------------------------------------- deterministic draws
    def _rng(self, *parts) -> random.Random:
        # a str seed is hashed with SHA-512 by random.seed: stable across runs and platforms
        return random.Random(":".join(str(p) for p in (self.seed,) + parts))

    def _tokens(self, rng: random.Random, n: int) -> List[int]:
        return rng.choices(range(1, self.vocab_size), k=n)

    def _fits(self, prompt_tokens: int, max_tokens: int) -> bool:
        return self.max_context is None or prompt_tokens + max_tokens <= self.max_context

    # -------------------------------------------------------------- chat
    def _chat_turn(self, t: ChatTenant, session: int, turn: int, time_s: float,
                   history: List[int]) -> Optional[Arrival]:
        rng = self._rng(t.name, "session", session, "turn", turn)
        new = _draw_length(rng, t.first_prompt_tokens if turn == 0 else t.turn_tokens)
        max_tokens = _draw_length(rng, t.output_tokens)
        if not self._fits(len(history) + new, max_tokens):
            return None
        prompt = list(history) + self._tokens(rng, new)
        return Arrival(time_s, t.name, session, prompt, max_tokens, turn)

    def _chat_start(self, t: ChatTenant) -> List[Arrival]:
        if t.arrival == "poisson":
            times = _poisson_times(self._rng(t.name, "arrivals"), t.start_s, t.rate_per_s, t.sessions)
        else:
            times = [t.start_s + i * t.stagger_s for i in range(t.sessions)]
        out = [self._chat_turn(t, i, 0, ts, []) for i, ts in enumerate(times)]
        return [a for a in out if a is not None]

    def _chat_next(self, t: ChatTenant, a: Arrival, output: List[int], finish_s: float) -> List[Arrival]:
        turn = a.index + 1
        if turn >= t.turns:
            return []
        think = _draw_time(self._rng(t.name, "session", a.key, "think", turn), t.think_time_s)
        nxt = self._chat_turn(t, a.key, turn, finish_s + think, list(a.prompt) + [int(x) for x in output])
        return [] if nxt is None else [nxt]

    # -------------------------------------------------------------- batch
    def _question(self, t: BatchTenant, index: int, key: int, time_s: float) -> Arrival:
        rng = self._rng(t.name, "question", index)
        n = _draw_length(rng, t.prompt_tokens)
        max_tokens = _draw_length(rng, t.output_tokens)
        return Arrival(time_s, t.name, key, self._tokens(rng, n), max_tokens, index)

    def _batch_start(self, t: BatchTenant) -> List[Arrival]:
        if t.arrival == "poisson":
            times = _poisson_times(self._rng(t.name, "arrivals"), t.start_s, t.rate_per_s, t.requests)
            self._next_question[t.name] = t.requests
            return [self._question(t, j, j % t.workers, ts) for j, ts in enumerate(times)]
        n = min(t.workers, t.requests)
        self._next_question[t.name] = n
        return [self._question(t, w, w, t.start_s + w * t.stagger_s) for w in range(n)]

    def _batch_next(self, t: BatchTenant, a: Arrival, finish_s: float) -> List[Arrival]:
        j = self._next_question.get(t.name, t.requests)
        if t.arrival == "poisson" or j >= t.requests:
            return []
        self._next_question[t.name] = j + 1
        return [self._question(t, j, a.key, finish_s + t.gap_s)]

    # -------------------------------------------------------------- the interface
    def start(self) -> List[Arrival]:
        """The arrivals known at the start of a run (resets any earlier run's state), by time."""
        self._next_question = {}
        out: List[Arrival] = []
        for t in self.tenants:
            out += self._chat_start(t) if isinstance(t, ChatTenant) else self._batch_start(t)
        return sorted(out, key=lambda a: a.time_s)

    def on_finish(self, arrival: Arrival, output_tokens: Sequence[int], finish_s: float) -> List[Arrival]:
        """Follow-ups of a finished request (``finish_s``: seconds from run start): the session's
        next turn, or the worker's next prompt; empty when that stream is done."""
        t = self._by_name.get(arrival.tenant)
        if t is None:
            return []
        if isinstance(t, ChatTenant):
            return self._chat_next(t, arrival, list(output_tokens), finish_s)
        return self._batch_next(t, arrival, finish_s)

    @property
    def total_requests(self) -> int:
        """Requests a full run sends (fewer if ``max_context`` ends chat sessions early)."""
        return sum(t.total_requests for t in self.tenants)

    def config(self) -> dict:
        """Everything that defines this workload, JSON-ready."""
        return {"kind": "workload", "name": self.name, "seed": self.seed, "vocab_size": self.vocab_size,
                "max_context": self.max_context,
                "tenants": [{"type": type(t).__name__, **dataclasses.asdict(t)} for t in self.tenants]}

    @classmethod
    def from_config(cls, config: dict) -> "Workload":
        """The workload a :meth:`config` dict describes (as saved with results), arrivals and all."""
        kinds = {"ChatTenant": ChatTenant, "BatchTenant": BatchTenant}
        if config.get("kind") != "workload":
            raise ValueError(f"not a workload config (kind {config.get('kind')!r}); a trace replays with "
                             f"TraceWorkload.from_file")
        tenants = []
        for t in config["tenants"]:
            t = dict(t)
            kind = t.pop("type")
            if kind not in kinds:
                raise ValueError(f"unknown tenant type {kind!r}; known: {sorted(kinds)}")
            tenants.append(kinds[kind](**{k: tuple(v) if isinstance(v, list) else v for k, v in t.items()}))
        return cls(tenants, vocab_size=config["vocab_size"], seed=config.get("seed", 0),
                   max_context=config.get("max_context"), name=config.get("name"))

    def __repr__(self) -> str:
        return f"Workload({self.name!r}, tenants={self.tenants!r}, seed={self.seed})"


# ---------------------------------------------------------------------------------- traces
def traces_dir() -> Path:
    """``data/traces/`` (follows ``MLXLAB_DATA``)."""
    return data_dir() / "traces"


def trace_path(path: Union[str, os.PathLike]) -> Path:
    """A bare name (``"seed-001"``) means ``data/traces/<name>.jsonl``; a path with a folder is
    used as given."""
    p = Path(path)
    if not p.is_absolute() and p.parent == Path("."):
        p = traces_dir() / p
    if not p.suffix:
        p = p.with_suffix(".jsonl")
    return p


def save_trace(path: Union[str, os.PathLike], arrivals: Iterable[Arrival]) -> Path:
    """Write arrivals as JSONL, one per line in time order; returns the path written."""
    p = trace_path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    rows = sorted(arrivals, key=lambda a: a.time_s)
    with open(p, "w") as f:
        for a in rows:
            f.write(json.dumps(a.as_dict(), separators=(",", ":")) + "\n")
    return p


def load_trace(path: Union[str, os.PathLike]) -> List[Arrival]:
    """Read a JSONL trace written by :func:`save_trace`."""
    with open(trace_path(path)) as f:
        return [Arrival.from_dict(json.loads(line)) for line in f if line.strip()]


class TraceWorkload:
    """Replays recorded arrivals open loop: every arrival at its recorded time, no follow-ups."""

    def __init__(self, arrivals: Iterable[Arrival], name: str = "trace"):
        self.arrivals = sorted((dataclasses.replace(a, prompt=list(a.prompt)) for a in arrivals),
                               key=lambda a: a.time_s)
        self.name = name

    @classmethod
    def from_file(cls, path: Union[str, os.PathLike]) -> "TraceWorkload":
        p = trace_path(path)
        return cls(load_trace(p), name=p.stem)

    @property
    def vocab_size(self) -> int:
        """Smallest vocabulary that holds every prompt token."""
        return max((max(a.prompt) for a in self.arrivals if a.prompt), default=0) + 1

    def start(self) -> List[Arrival]:
        return list(self.arrivals)

    def on_finish(self, arrival: Arrival, output_tokens: Sequence[int], finish_s: float) -> List[Arrival]:
        return []

    @property
    def total_requests(self) -> int:
        return len(self.arrivals)

    def config(self) -> dict:
        tenants: Dict[str, int] = {}
        for a in self.arrivals:
            tenants[a.tenant] = tenants.get(a.tenant, 0) + 1
        return {"kind": "trace", "name": self.name, "arrivals": len(self.arrivals), "tenants": tenants}


# ---------------------------------------------------------------------------------- presets
# Seed-001 numbers at the case study's own scale (scale=1). "seed" = stated in
# ../shared/seeds/seed-001; "assumed" = not stated there, chosen to be consistent with it.
SEED_CHAT_FINAL_PREFIX_TOKENS = 23_000  # seed: agent sessions "hover around 23k tokens"
SEED_CHAT_TURNS = 8  # assumed: enough turns for the prefix to grow visibly
SEED_CHAT_FIRST_PROMPT_TOKENS = 16_000  # assumed: system prompt + tool schemas + task, so 8 turns reach ~23k
SEED_CHAT_TURN_TOKENS = (500, 1_100)  # assumed: tool results / user messages, mean 800
SEED_BATCH_PROMPT_TOKENS = (10_000, 25_000)  # seed: "each a fresh 10-25k+ token prompt"
SEED_BATCH_QUESTIONS = 150  # seed: "a run is ~150 questions"
SEED_BATCH_WORKERS = 4  # assumed: the seed says "several concurrent workers"
SEED_INPUT_OUTPUT_RATIO = 77  # seed: day-average input:output ratio 77:1
SEED_THINK_TIME_S = 3.0  # assumed: tool execution / reading time between agent turns (not scaled)
# Output lengths follow the 77:1 ratio per tenant: mean prompt / 77.
SEED_BATCH_OUTPUT_TOKENS = round(sum(SEED_BATCH_PROMPT_TOKENS) / 2 / SEED_INPUT_OUTPUT_RATIO)  # 227
SEED_CHAT_OUTPUT_TOKENS = 250  # ~ mean chat prompt (~19.6k over 8 turns) / 77; last turn ~23.3k


def _scale_length(v: Length, scale: float) -> Length:
    if isinstance(v, int):
        return max(1, round(v * scale))
    return (max(1, round(v[0] * scale)), max(1, round(v[1] * scale)))


def _preset_chat(scale: float, min_output_tokens: int) -> ChatTenant:
    return ChatTenant(
        sessions=1, turns=SEED_CHAT_TURNS,
        first_prompt_tokens=_scale_length(SEED_CHAT_FIRST_PROMPT_TOKENS, scale),
        turn_tokens=_scale_length(SEED_CHAT_TURN_TOKENS, scale),
        output_tokens=max(min_output_tokens, _scale_length(SEED_CHAT_OUTPUT_TOKENS, scale)),
        think_time_s=SEED_THINK_TIME_S, name="chat")


def _preset_batch(scale: float, min_output_tokens: int, workers: int, requests: int) -> BatchTenant:
    return BatchTenant(
        workers=workers, requests=requests,
        prompt_tokens=_scale_length(SEED_BATCH_PROMPT_TOKENS, scale),
        output_tokens=max(min_output_tokens, _scale_length(SEED_BATCH_OUTPUT_TOKENS, scale)),
        name="batch")


WORKLOAD_PRESETS = ("chat-solo", "chat+batch", "seed-001")


def workload_preset(name: str, *, vocab_size: int, scale: float = 1.0, seed: int = 0,
                    min_output_tokens: int = 16, max_context: Optional[int] = None,
                    chat: Optional[dict] = None, batch: Optional[dict] = None) -> Workload:
    """A named workload with every token length multiplied by ``scale``.

    * ``"chat-solo"``: one seed-001 agent session alone (the no-contention baseline).
    * ``"chat+batch"``: that session plus 2 batch workers sending 8 fresh seed-length prompts
      (the stall experiment at its smallest).
    * ``"seed-001"``: the case study's mix: one agent session whose prefix grows toward ~23k
      tokens and 4 workers sending 150 fresh 10-25k-token prompts, outputs at 77:1.

    ``scale`` shrinks prompts to the machine (``scale=1/32``: ~500-token first chat prompt growing
    to ~800, 312-781-token batch prompts). Output lengths are scaled too but kept at least
    ``min_output_tokens`` so each turn still yields enough inter-token gaps to measure (at small
    scale that lowers the input:output ratio below 77:1). Times (think time) are not scaled.
    ``chat`` / ``batch``: field overrides for the tenants, e.g. ``batch={"requests": 20}``.
    The constants ``SEED_*`` in this module hold the seed-scale numbers and their origin."""
    if not scale > 0:
        raise ValueError(f"scale must be positive, got {scale!r}")
    if name == "chat-solo":
        tenants: List[Tenant] = [_preset_chat(scale, min_output_tokens)]
    elif name == "chat+batch":
        tenants = [_preset_chat(scale, min_output_tokens), _preset_batch(scale, min_output_tokens, 2, 8)]
    elif name == "seed-001":
        tenants = [_preset_chat(scale, min_output_tokens),
                   _preset_batch(scale, min_output_tokens, SEED_BATCH_WORKERS, SEED_BATCH_QUESTIONS)]
    else:
        raise ValueError(f"unknown workload preset {name!r}; choose one of {list(WORKLOAD_PRESETS)}")
    overrides = {"chat": chat or {}, "batch": batch or {}}
    for key, fields in overrides.items():
        if fields and not any(t.name == key for t in tenants):
            raise ValueError(f"preset {name!r} has no {key} tenant to override")
    tenants = [dataclasses.replace(t, **overrides.get(t.name, {})) for t in tenants]
    label = name if scale == 1 else f"{name}@{scale:.4g}"
    return Workload(tenants, vocab_size=vocab_size, seed=seed, max_context=max_context, name=label)
