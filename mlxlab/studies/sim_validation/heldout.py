"""Held-out traces for the simulator validation: seeded random workloads nobody tuned for (no MLX).

The validation mixes (:func:`mlxlab.studies.sim_validation.run.validation_workloads`) are the
workloads the cost terms were added for, and the profile grid is planned around them
(:func:`mlxlab.studies.sim_validation.run.targeted_grid`). A held-out case is drawn instead: a few
chats and one or two documents arriving open loop at random times, with random prompt lengths,
output lengths, chunk size and policy option (``stall_free``'s token budget, ``admission_gate``'s
big-prompt threshold), none of them a value of the grid or of the standard runs (``avoid``).
Each case runs one policy; the policies are dealt out in turn from a random start so every policy
gets its share of the cases.

Every draw of case ``i`` comes from ``random.Random(f"heldout {seed} {i}")``, so a seed fixes every
case whatever ``n`` is (case 3 of ``n=4`` is case 3 of ``n=8``), and a case is saved as its spec
(:meth:`HeldOutCase.as_dict`: arrival times, prompt and output lengths, tenant, the policy and its
options), from which :meth:`HeldOutCase.workload` rebuilds the same trace (prompt tokens drawn
from the case's own seed) on any machine: a saved validation is rescored from its file.

The ranges at ``scale`` 1 are those of ``small`` on a CPU (chats of 80-320 tokens 0.05-0.3 s
apart, documents of 700-1,800 tokens, chunks of 96-352 tokens); ``scale`` multiplies every length
(~8 for a 1.5B model on a GPU), not the times.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Iterable, List, Optional, Sequence, Tuple

from mlxlab.core.workload import Arrival, TraceWorkload

HELDOUT_POLICIES = ("interleave", "admission_gate", "stall_free")
# (low, high) inclusive, in tokens at scale 1 / seconds
CHATS = (2, 4)
CHAT_PROMPT = (80, 320)
CHAT_GAP_S = (0.05, 0.30)
CHAT_OUTPUT = (16, 40)
DOCS = (1, 2)
DOC_PROMPT = (700, 1800)
DOC_ARRIVAL_S = (0.0, 0.8)
DOC_OUTPUT = (4, 12)
CHUNK = (96, 352)
BUDGET = (96, 352)
BIG_PROMPT = (400, 650)  # between the longest chat and the shortest document


@dataclass
class HeldOutCase:
    """One held-out run: its trace (``arrivals``: dicts of ``time_s``, ``tenant``, ``key``,
    ``prompt_tokens``, ``max_tokens``), the policy, chunk size and policy options it runs with, and
    the seed its prompt tokens are drawn from."""

    name: str
    policy: str
    chunk_size: int
    options: dict = field(default_factory=dict)
    arrivals: List[dict] = field(default_factory=list)
    seed: int = 0

    def workload(self, vocab_size: int) -> TraceWorkload:
        """The trace, prompt tokens drawn uniformly from ``[1, vocab_size)`` with the case's seed."""
        if vocab_size < 2:
            raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
        rng = random.Random(f"heldout tokens {self.seed} {self.name}")
        arr = [Arrival(time_s=float(a["time_s"]), tenant=a["tenant"], key=int(a["key"]),
                       prompt=[rng.randrange(1, vocab_size) for _ in range(int(a["prompt_tokens"]))],
                       max_tokens=int(a["max_tokens"])) for a in self.arrivals]
        return TraceWorkload(arr, name=self.name)

    @property
    def longest_prompt(self) -> int:
        return max(int(a["prompt_tokens"]) for a in self.arrivals)

    def label(self) -> str:
        """The case in one line: policy, chunk, option, the trace's shape."""
        opt = ", ".join(f"{k}={v}" for k, v in self.options.items())
        chats = [a for a in self.arrivals if a["tenant"] == "chat"]
        docs = [a for a in self.arrivals if a["tenant"] == "doc"]
        return (f"{self.name}: {self.policy} chunk {self.chunk_size}{', ' + opt if opt else ''}; "
                f"{len(chats)} chats of {'/'.join(str(a['prompt_tokens']) for a in chats)} tokens, "
                f"{len(docs)} docs of {'/'.join(str(a['prompt_tokens']) for a in docs)}")

    def as_dict(self) -> dict:
        return {"name": self.name, "policy": self.policy, "chunk_size": self.chunk_size,
                "options": dict(self.options), "arrivals": [dict(a) for a in self.arrivals], "seed": self.seed}

    @classmethod
    def from_dict(cls, d: dict) -> "HeldOutCase":
        return cls(name=d["name"], policy=d["policy"], chunk_size=int(d["chunk_size"]),
                   options=dict(d.get("options") or {}), arrivals=[dict(a) for a in d["arrivals"]],
                   seed=int(d.get("seed", 0)))


def _draw(rng: random.Random, lo_hi: Tuple[int, int], scale: float = 1.0, avoid: Iterable[int] = ()) -> int:
    """An integer in ``lo_hi`` times ``scale``, not one of ``avoid``."""
    lo, hi = max(1, round(lo_hi[0] * scale)), max(1, round(lo_hi[1] * scale))
    banned = set(int(a) for a in avoid)
    if hi - lo + 1 <= len(banned & set(range(lo, hi + 1))):
        raise ValueError(f"no value in [{lo}, {hi}] outside {sorted(banned)}")
    while True:
        v = rng.randint(lo, hi)
        if v not in banned:
            return v


def heldout_case(i: int, seed: int, policy: str, *, scale: float = 1.0, max_context: Optional[int] = None,
                 avoid: Iterable[int] = ()) -> HeldOutCase:
    """Case ``i`` of seed ``seed`` under ``policy`` (see the module docstring)."""
    if policy not in HELDOUT_POLICIES:
        raise ValueError(f"held-out policy must be one of {list(HELDOUT_POLICIES)}, got {policy!r}")
    if not scale > 0:
        raise ValueError(f"scale must be positive, got {scale!r}")
    avoid = set(int(a) for a in avoid)
    rng = random.Random(f"heldout {seed} {i}")
    cap = (max_context - 64) if max_context else None

    def length(r, out):
        n = _draw(rng, r, scale)
        return min(n, cap - out) if cap else n

    arrivals, t = [], 0.0
    for k in range(rng.randint(*CHATS)):
        out = rng.randint(*CHAT_OUTPUT)
        arrivals.append({"time_s": round(t, 4), "tenant": "chat", "key": k, "prompt_tokens": length(CHAT_PROMPT, out),
                         "max_tokens": out})
        t += rng.uniform(*CHAT_GAP_S)
    for k in range(rng.randint(*DOCS)):
        out = rng.randint(*DOC_OUTPUT)
        arrivals.append({"time_s": round(rng.uniform(*DOC_ARRIVAL_S), 4), "tenant": "doc", "key": k,
                         "prompt_tokens": length(DOC_PROMPT, out), "max_tokens": out})
    arrivals.sort(key=lambda a: (a["time_s"], a["tenant"], a["key"]))
    chunk = _draw(rng, CHUNK, scale, avoid)
    options = {}
    if policy == "stall_free":
        options["token_budget"] = _draw(rng, BUDGET, scale, avoid | {chunk})
    elif policy == "admission_gate":
        options["big_prompt_tokens"] = _draw(rng, BIG_PROMPT, scale, avoid)
    return HeldOutCase(name=f"heldout-{seed}-{i}", policy=policy, chunk_size=chunk, options=options,
                       arrivals=arrivals, seed=seed)


def heldout_cases(n: int, seed: int, *, scale: float = 1.0, max_context: Optional[int] = None,
                  policies: Sequence[str] = HELDOUT_POLICIES, avoid: Iterable[int] = ()) -> List[HeldOutCase]:
    """``n`` held-out cases of seed ``seed``, the policies dealt out in turn from a start drawn
    from the seed; ``avoid``: chunk sizes and options the cases must not use (the profile grid's
    chunk sizes, the standard runs' chunk size)."""
    if n < 0:
        raise ValueError(f"the number of held-out cases must be >= 0, got {n}")
    pols = [p for p in policies]
    if not pols:
        raise ValueError("held-out cases need at least one policy")
    start = random.Random(f"heldout {seed} policies").randrange(len(pols))
    return [heldout_case(i, seed, pols[(start + i) % len(pols)], scale=scale, max_context=max_context, avoid=avoid)
            for i in range(n)]
