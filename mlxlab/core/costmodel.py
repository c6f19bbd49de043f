"""A step-time cost model fitted from step records (pure numpy, no MLX).

One step's time is modelled as a non-negative combination of what it does (seconds per unit of
each of :data:`FEATURES`)::

    t = decode_step * [decodes] + decode_batched * [batch of 2+] + decode_batch * b
        + decode_context_tokens * kv + decode_padding_tokens * pad + join_tokens * J + drop_tokens * D
        + join_rows * rows + batch_changes * [batch changed]
        + prefill_chunks * chunks + prefill_tokens * n + prefill_attention * pairs
        + prefill_attention_unaligned * unaligned pairs + packed_changes * [packed step changed rows]
        + prefill_attention_masked * masked pairs + ragged_change_rows * rows after a ragged change
        + cold_chunks * chunks of a token count the run has not run before

Each term, and what it stands for in the engine (:mod:`mlxlab.engine`):

* ``decode_step``: 1 if the step ran a decode forward: reading every weight once, launching the
  kernels, building the graph in Python.
* ``decode_batched``: 1 if that decode ran two or more sequences. They share one masked
  ``BatchKVCache`` (a mask array, per-row offsets), while a lone stream decodes on a plain
  ``KVCache`` with no mask: the two paths have different fixed costs.
* ``decode_batch``: per sequence advanced (its activations, sampling, logits).
* ``decode_context_tokens``: KV positions of the decoding rows, the sum of their contexts (a lone
  stream's context).
* ``decode_padding_tokens``: the left padding a batch of two or more reads beside them: its
  ``BatchKVCache`` is as wide as its longest row, so ``b x longest`` less the sum. A step record
  (:meth:`mlxlab.core.request.StepRecord.as_dict`) holds the sum; a profile record carries the padded
  count as ``decode_kv_tokens``. Whether the masked attention pays for the padding as for real
  positions is for the profile to say (:func:`mlxlab.sim.measure.profile_device` times a short row
  decoding beside a long one); a fit without such steps charges it as real context.
* ``join_tokens``: KV positions copied when finished prefills join the decode batch
  (``BatchKVCache.merge``/``extend`` pad and copy every row to the longest): ``rows x longest``
  of the batch after the join; 0 when a lone stream starts on its own cache.
* ``drop_tokens``: KV positions copied when rows leave the batch (``filter`` gathers the kept
  rows at the old width, ``extract`` copies the one row left back to a plain cache).
* ``join_rows``: rows merged into a ``BatchKVCache`` at a join; ``batch_changes``: 1 if the
  step joined rows into a batch of two or more or dropped rows. These are the host-side costs
  of a change, which do not grow with the bytes: ``merge`` builds a zeros array and a slice
  update per row for every layer's keys and values (host work that grows with rows and layers:
  ``probes/rebatch_probe.py``, ``data/results/h200/rebatch_probe.json``), ``filter`` reads
  the left padding back per layer, and the first forward after a change meets new shapes.
* ``prefill_attention_masked``: the query-key pairs a chunk's causal mask throws away
  (``n**2 / 2`` per chunk, ``n`` with its pad): an attention that computes the whole
  ``n x (context + n)`` score matrix and then masks it (mlx's CPU path: the unfused
  ``q @ k.T``, mask, softmax, ``@ v``) pays for them as for the kept pairs, a kernel that skips
  masked blocks does not. Measured on ``small`` float32 (``data/profiles/cpu-small.json`` before
  this term): one 1,792-token chunk at context 0 took 3.59 s where the kept pairs alone predicted
  2.35 s, while 256 tokens at context 1,952 (the same per-pair price, few masked pairs) fitted to
  2%; ``n x (context + n)`` at the small chunks' per-pair price gives 3.6 s.
* ``packed_changes``: 1 if the decode rows changed (a row's first decode, a join, a drop) in a
  packed step (:mod:`mlxlab.engine.fused`: one forward for the decode and the chunks). Such a step
  costs more than the same step without the change, while a change in a decode-only step costs what ``join_rows`` and ``batch_changes`` say (``start``/``join``/``drop``
  cells of :func:`mlxlab.sim.measure.profile_device`, ``data/results/h200/sim_validation.json``).
* ``ragged_change_rows``: the rows of a left-padded ``BatchKVCache`` (rows of different lengths)
  right after a decode step changed it (rows joined or left, and two or more remain ragged):
  ``extend`` re-pads and concatenates every row of every layer's keys and values, ``filter``
  gathers them, at a batch shape the step before did not have, and the forward then runs the
  masked attention at that shape. On the H200 such a change into a ragged batch of three or four
  rows cost 25-55 ms more than its two-row counterpart in the validation workloads
  (``data/results/h200/sim_validation_steps.log``: "decode b3 changed" 0.24-0.42 of the engine),
  while a profile built only of even batches (one plain ``KVCache``, :mod:`mlxlab.engine.batch`)
  never meets one; :class:`mlxlab.sim.cells.RaggedCase` times such changes at two to four rows.
* ``cold_chunks``: chunks whose token count (pad included) no earlier chunk of the run had: the
  first forward of a query length the process has not run lately (kernels, graphs and buffers
  of that shape set up again). On the H200 the first 1,023-token chunk of a profile share taken
  after other work cost 16-36 ms more than the same cell right after the profile's warm-up
  (``data/results/h200/sim_validation*.json``, profile records of shares 2 and later), and the
  held-out runs' first chunks of sizes the grid lacks ran 20-40 ms slower than the grid predicts.
  Profile records carry the count (``cold_chunks``: :func:`mlxlab.sim.cells.cold_group`).
  Which chunks are cold depends on how the backend keys what it prepares (:class:`WarmShapes`,
  the model's ``cold_key``): by token count (``"size"``, the CPU and Metal), or on mlx's CUDA
  backend with cuDNN attention on by the attention's whole shape (``"shape"``: token count and
  key length), since mlx keeps one cuDNN graph per exact query, key and value shape and stride
  in an LRU of ``MLX_CUDA_SDPA_CACHE_SIZE`` graphs (256 by default;
  ``mlx/backend/cuda/scaled_dot_product_attention.cpp``). There a chunk whose size follows the
  decode batch (``stall_free``'s budget less its decode rows) or is chosen anew each step
  (``slo``) meets a new shape nearly every step, while a fixed chunk size meets the same shapes
  prompt after prompt: on an H100 ``stall_free`` at a 256-token budget gave the chat a median ITL
  of 67-78 ms against 26-31 ms for ``interleave`` at 256-token chunks
  (``data/results/h100/tune_*_before_shape_cold.json``), a gap a size-keyed term cannot see.
  ``probes/shape_probe.py`` measured a first use directly on the H100: a 256-token chunk at 4k
  context cost 66 ms more the first time the process met its key length (or its size), 4-8 ms
  more with cuDNN attention off, 70 ms more with CUDA graphs off
  (``data/results/h100/shape_probe_*.json``); the shape-keyed profiles of the tunes that followed
  fitted 58-62 ms per cold chunk, and their simulator ranked the grid as the engine did
  (``data/results/h100/tune_qwen2.5-coder-1.5b_before_key_align.json``, tau 0.84 where the size
  rule gave 0.60; the tune after it, with chunks aligned coarsely, has far fewer cold chunks).
* ``prefill_chunks``: per chunk forward (its fixed cost); ``prefill_tokens``: tokens pushed
  through the linear layers; ``prefill_attention``: query-key pairs of the chunks' attention
  (``n * context + n**2 / 2`` per chunk); ``prefill_attention_unaligned``: the pairs of chunks
  whose key length (``context + n``) is not a multiple of :data:`KEY_ALIGN`, each weighted by
  :func:`unaligned_weight` (1 for an odd key length, 1/2 or 1/4 for a multiple of 2 or 4). A
  chunk the engine padded (``Engine(key_align=8)``) counts its pad tokens. On mlx's CUDA
  backend such a chunk's attention runs a slower path (``probes/chunk_probe.py``,
  ``data/results/h200/chunk_probe.json``); on the CPU the fit leaves it near 0.

Two timing parameters sit beside the linear terms (both measured by :mod:`mlxlab.sim.measure`):

* ``overhead_s``: host time between two steps that no step record covers (the run loop,
  ``policy.schedule``, building the scheduler state). The simulator adds it before every step.
* ``tail_s``: how long a decode's forward is still running after the engine's Python returned
  from queueing it. The engine pipelines decode-only steps: step k's tokens are read (and
  stamped) by step k+1, after step k+1 queued its own forward, so a stream's token after a run of
  decode-only steps comes ``tail_s`` after the one before it, and the first token after a prefill
  chunk waits for one more decode. ``None`` (an old profile, a derived one): tokens are stamped
  when their own step ends (the simulator's behaviour before the tail was measured).

The same model serves the ``slo`` policy (to choose a chunk size) and the simulator (to charge a
plan), so both read step records the same way. Profiles saved with the six features of earlier
versions (``decode_step, decode_batch, decode_context_tokens, prefill_chunks, prefill_tokens,
prefill_attention``) load with no batched, join or drop cost; profiles saved before the padding
term charge padding as real context, as they did; profiles saved before
``prefill_attention_masked``, ``ragged_change_rows`` or ``cold_chunks`` charge nothing for them,
as they did.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
from scipy.optimize import nnls

from mlxlab.core.plan import KEY_ALIGN

FEATURES = ("decode_step", "decode_batched", "decode_batch", "decode_context_tokens", "join_tokens", "drop_tokens",
            "join_rows", "batch_changes", "prefill_chunks", "prefill_tokens", "prefill_attention",
            "prefill_attention_unaligned", "decode_padding_tokens", "packed_changes", "prefill_attention_masked",
            "ragged_change_rows", "cold_chunks")
LEGACY_FEATURES = ("decode_step", "decode_batch", "decode_context_tokens", "prefill_chunks", "prefill_tokens",
                   "prefill_attention")
DECODE_FEATURES = [0, 1, 2, 3, 12]  # what a decode forward costs
REBATCH_FEATURES = [4, 5, 6, 7, 15]  # changes of the decode batch
PREFILL_FEATURES = [8, 9, 10, 11, 14, 16]  # prefill chunks
PACKED_FEATURES = [13]  # a change of the decode rows inside a packed forward


def unaligned_weight(key_length: int) -> float:
    """How much of the unaligned attention penalty a chunk with this key length pays: 0 when it
    is a multiple of :data:`KEY_ALIGN`, else ``1 / gcd(key_length, KEY_ALIGN)``. Measured on the
    H200 at 8k context (``data/results/h200/chunk_probe.json``), a chunk's extra time over its
    aligned neighbour was +20 ms for 511 (odd key length), +8 ms for 510 (gcd 2) and +4.8 ms for
    508 (gcd 4): 1, 0.40 and 0.24 of the odd case, against 1, 0.5 and 0.25 here."""
    g = math.gcd(int(key_length), KEY_ALIGN)
    return 0.0 if g == KEY_ALIGN else 1.0 / g


def _chunk(c) -> Tuple[int, int, int]:
    """A chunk as (tokens, context, pad): pairs (tokens, context) have no pad."""
    return (int(c[0]), int(c[1]), int(c[2]) if len(c) > 2 else 0)


def features(decode_batch: int = 0, decode_context_tokens: int = 0,
             chunks: Sequence[Tuple[int, ...]] = (), join_tokens: int = 0, drop_tokens: int = 0,
             join_rows: int = 0, batch_change: bool = False, packed: bool = False,
             decode_padding_tokens: int = 0, joined: int = 0, ragged: bool = False,
             cold_chunks: int = 0) -> np.ndarray:
    """The feature vector of a step. ``decode_context_tokens``: the KV positions of the decoding
    rows (the sum of their contexts); ``decode_padding_tokens``: the left padding a batch reads
    beside them (``b x longest row`` less that sum); ``chunks`` lists (tokens, context before
    the chunk), or (tokens, context, pad) for a chunk the engine ran with ``pad`` extra tokens
    (:func:`mlxlab.core.request.pad_tokens`: those go through the model too); ``join_rows``: rows
    merged into a batch cache; ``batch_change``: the step joined rows into a batch or dropped
    rows; ``packed``: the decode and the chunks run as one forward (:mod:`mlxlab.engine.fused`), so the
    decode's fixed cost (``decode_step``, ``decode_batched``: a whole forward's weights and host
    work) is the chunk's, and only its per-row and context terms are added; ``joined``: rows
    that began decoding at this step (a lone row's first decode counts too), which with
    ``packed``, like any batch change, costs ``packed_changes``; ``ragged``: the batch after this
    step's change is a left-padded one of two or more rows (``ragged_change_rows``: its rows);
    ``cold_chunks``: how many of ``chunks`` have a token count the run had not run before."""
    b = int(decode_batch)
    own = not (packed and chunks)  # a packed decode rides on its chunks' forward
    ran = [(n + p, c) for n, c, p in map(_chunk, chunks)]
    pairs = [n * c + n * n / 2.0 for n, c in ran]
    return np.array([
        1.0 if (b and own) else 0.0,
        1.0 if (b >= 2 and own) else 0.0,
        float(b),
        float(decode_context_tokens) if b else 0.0,
        float(join_tokens) if b else 0.0,
        float(drop_tokens) if b else 0.0,
        float(join_rows) if b else 0.0,
        1.0 if (b and (batch_change or join_rows)) else 0.0,
        float(len(ran)),
        float(sum(n for n, _ in ran)),
        float(sum(pairs)),
        float(sum(p * unaligned_weight(n + c) for p, (n, c) in zip(pairs, ran))),
        float(decode_padding_tokens) if b >= 2 else 0.0,
        1.0 if (b and packed and chunks and (joined or join_rows or batch_change)) else 0.0,
        float(sum(n * n / 2.0 for n, _ in ran)),
        float(b) if (b >= 2 and ragged and (batch_change or join_rows)) else 0.0,
        float(min(int(cold_chunks), len(ran))),
    ])


def rebatch_counts(rec: dict) -> Tuple[int, bool]:
    """``(join_rows, batch_change)`` of a step record: rows that joined a decode batch of two or
    more (a lone stream starting on its own cache copies nothing), and whether the batch changed.
    Records without ``joined``/``dropped`` (earlier versions) fall back on ``join_tokens`` /
    ``drop_tokens``: a change, of unknown rows."""
    b = int(rec.get("decode_batch", 0) or 0)
    joined = int(rec.get("joined", 0) or 0) if b >= 2 else 0
    dropped = int(rec.get("dropped", 0) or 0)
    change = bool(joined or dropped or rec.get("join_tokens") or rec.get("drop_tokens"))
    return joined, change


def record_features(rec: dict) -> np.ndarray:
    """Features of a step record dict (``StepRecord.as_dict()``, or a profile record with the
    extra fields ``decode_kv_tokens``, ``join_tokens``, ``drop_tokens``). Each chunk counts as it
    ran when the record lists them (``prefill_chunks``: [tokens, context] pairs); a record's
    ``decode_kv_tokens`` above its ``decode_context_tokens`` (padding) makes a change ragged, and
    its ``cold_chunks`` counts its cold chunks (both only profile records have); a record without
    that list treats several chunks as one of their summed tokens after their summed context
    (exact for the usual one-chunk step)."""
    n = rec.get("prefill_tokens", 0)
    seqs = rec.get("prefill_seqs") or []
    chunks = [(n, rec.get("prefill_context_tokens", 0))] if n else []
    ctx = rec.get("decode_context_tokens", 0) or 0
    kv = rec.get("decode_kv_tokens")
    pad = max(0, kv - ctx) if kv is not None else 0
    rows, change = rebatch_counts(rec)
    f = features(rec.get("decode_batch", 0), ctx, chunks, rec.get("join_tokens", 0), rec.get("drop_tokens", 0),
                 rows, change, packed=bool(rec.get("fused")), decode_padding_tokens=pad,
                 joined=int(rec.get("joined", 0) or 0), ragged=pad > 0,
                 cold_chunks=int(rec.get("cold_chunks", 0) or 0))
    listed = rec.get("prefill_chunks")
    if n and listed and sum(int(c[0]) for c in listed) == n:  # each chunk as it ran: exact for several
        g = features(0, 0, listed, cold_chunks=int(rec.get("cold_chunks", 0) or 0))
        for name in ("prefill_chunks", "prefill_tokens", "prefill_attention", "prefill_attention_unaligned",
                     "prefill_attention_masked", "cold_chunks"):
            f[FEATURES.index(name)] = g[FEATURES.index(name)]
        return f
    f[FEATURES.index("prefill_chunks")] = float(len(seqs)) if n else 0.0
    return f


def solve_nnls(X: np.ndarray, y: np.ndarray, ridge: float) -> np.ndarray:
    """Least squares with non-negative coefficients (:func:`scipy.optimize.nnls`, Lawson and
    Hanson's active-set method) and a small ridge penalty, as ``X`` augmented with
    ``sqrt(ridge) * I`` rows (and ``y`` with zeros): the penalty keeps two features that move
    together (the attention pairs of aligned and unaligned chunks) both in the solution instead
    of an arbitrary one, and the solve well-posed when a feature is all zeros."""
    k = X.shape[1]
    if ridge > 0:
        X = np.vstack([X, np.sqrt(ridge) * np.eye(k)])
        y = np.concatenate([y, np.zeros(k)])
    coef, _ = nnls(np.asarray(X, dtype=float), np.asarray(y, dtype=float), maxiter=50 * k)
    return np.maximum(coef, 0.0)


class WarmShapes:
    """Which chunk shapes a run has met, to count its cold chunks (``cold_chunks``). ``key``
    ``"size"``: a chunk is warm once a chunk of its token count (pad included) ran, for good;
    ``"shape"``: once a chunk of its token count ran at its key length (context + tokens), and
    only while it is among the ``capacity`` shapes met most recently (an LRU, as mlx's graph
    cache; ``None``: no limit)."""

    KEYS = ("size", "shape")

    def __init__(self, key: str = "size", capacity: Optional[int] = None):
        if key not in self.KEYS:
            raise ValueError(f"cold key must be one of {self.KEYS}, got {key!r}")
        if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1):
            raise ValueError(f"capacity must be a positive integer or None, got {capacity!r}")
        self.key = key
        self.capacity = capacity if key == "shape" else None
        self._seen: "OrderedDict[tuple, None]" = OrderedDict()

    def _key(self, chunk) -> tuple:
        n, c, p = _chunk(chunk)
        return (n + p,) if self.key == "size" else (n + p, c + n + p)

    def cold(self, chunks: Sequence[Tuple[int, ...]]) -> List[int]:
        """1 for each chunk ((tokens, context) or (tokens, context, pad)) that is cold, 0 for a
        warm one; all of them are warm (the most recent) afterwards."""
        out = []
        for ch in chunks:
            k = self._key(ch)
            out.append(0 if k in self._seen else 1)
            self._seen[k] = None
            self._seen.move_to_end(k)
            if self.capacity is not None and len(self._seen) > self.capacity:
                self._seen.popitem(last=False)
        return out


@dataclass
class StepCostModel:
    """Step time in seconds as a non-negative linear model of :data:`FEATURES`, plus the
    per-step host ``overhead_s`` and the decode ``tail_s`` (see the module docstring)."""

    coef: np.ndarray = field(default_factory=lambda: np.zeros(len(FEATURES)))
    n_obs: int = 0
    source: str = "unfitted"
    overhead_s: float = 0.0
    tail_s: Optional[float] = None
    cold_key: str = "size"
    cold_capacity: Optional[int] = None

    def warm_shapes(self) -> WarmShapes:
        """A fresh :class:`WarmShapes` keyed as this model's profile counted its cold chunks."""
        return WarmShapes(self.cold_key, self.cold_capacity)

    def __post_init__(self):
        self.coef = np.asarray(self.coef, dtype=float)
        if self.coef.shape != (len(FEATURES),):
            raise ValueError(f"need {len(FEATURES)} coefficients ({', '.join(FEATURES)}), got {self.coef.shape}; "
                             f"use StepCostModel.from_coefficients for a subset by name")
        if (self.coef < 0).any() or self.overhead_s < 0 or (self.tail_s is not None and self.tail_s < 0):
            raise ValueError("cost model coefficients, overhead_s and tail_s must be >= 0")
        self.warm_shapes()  # checks cold_key and cold_capacity

    @property
    def fitted(self) -> bool:
        return self.n_obs > 0

    @classmethod
    def from_coefficients(cls, coefficients: Dict[str, float], **kwargs) -> "StepCostModel":
        """A model from ``{feature name: seconds per unit}``; features not named cost nothing."""
        unknown = set(coefficients) - set(FEATURES)
        if unknown:
            raise ValueError(f"unknown cost model features {sorted(unknown)}; known: {list(FEATURES)}")
        return cls(coef=np.array([float(coefficients.get(f, 0.0)) for f in FEATURES]), **kwargs)

    @classmethod
    def fit(cls, records: Iterable[dict], ridge: float = 1e-9, source: str = "step records") -> "StepCostModel":
        """Fit to step records (dicts with ``duration_s``). Columns are scaled before the
        solve so tokens and token-pairs get comparable weight."""
        recs = [r for r in records if r.get("duration_s", 0) > 0]
        if not recs:
            return cls(source=source)
        X = np.stack([record_features(r) for r in recs])
        y = np.array([r["duration_s"] for r in recs])
        scale = X.max(axis=0)
        scale[scale == 0] = 1.0
        coef = solve_nnls(X / scale, y, ridge) / scale
        return cls(coef=coef, n_obs=len(recs), source=source)

    def predict(self, decode_batch: int = 0, decode_context_tokens: int = 0,
                chunks: Sequence[Tuple[int, int]] = (), join_tokens: int = 0, drop_tokens: int = 0,
                join_rows: int = 0, batch_change: bool = False, packed: bool = False,
                decode_padding_tokens: int = 0, joined: int = 0, ragged: bool = False,
                cold_chunks: int = 0) -> float:
        """Predicted step time in seconds (the linear terms; not ``overhead_s``)."""
        return float(features(decode_batch, decode_context_tokens, chunks, join_tokens, drop_tokens, join_rows,
                              batch_change, packed, decode_padding_tokens, joined, ragged, cold_chunks) @ self.coef)

    def predict_record(self, rec: dict) -> float:
        return float(record_features(rec) @ self.coef)

    def largest_chunk(self, budget_s: float, decode_batch: int, decode_context_tokens: int,
                      context: int, lo: int, hi: int) -> int:
        """The largest chunk in [lo, hi] whose step (with this decode) is predicted to fit in
        ``budget_s``; ``lo`` if none does."""
        if self.predict(decode_batch, decode_context_tokens, [(hi, context)]) <= budget_s:
            return hi
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.predict(decode_batch, decode_context_tokens, [(mid, context)]) <= budget_s:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def efficient_chunk(self, decode_batch: int, decode_context_tokens: int, context: int, lo: int, hi: int,
                        efficiency: float = 0.5) -> int:
        """The smallest chunk in [lo, hi] whose predicted prefill cost per token (the step beyond
        its decode alone, over the chunk's tokens) is at most ``1 / efficiency`` times the
        cheapest per-token cost in the range: where a chunk's fixed cost stops dominating.
        Candidates are ``lo``, ``hi`` and a geometric grid (ratio 2**0.25) between them."""
        if not 0 < efficiency <= 1:
            raise ValueError(f"efficiency must be in (0, 1], got {efficiency}")
        base = self.predict(decode_batch, decode_context_tokens, [])
        steps = int(np.floor(4 * np.log2(hi / lo))) if hi > lo else 0
        cands = sorted({lo, hi} | {min(hi, int(round(lo * 2 ** (k / 4)))) for k in range(steps + 1)})
        cost = [(self.predict(decode_batch, decode_context_tokens, [(n, context)]) - base) / n for n in cands]
        bar = min(cost) / efficiency
        return next(n for n, c in zip(cands, cost) if c <= bar + 1e-15)

    def coefficients(self) -> Dict[str, float]:
        """The coefficients by feature name (seconds per unit of each feature)."""
        return {f: float(c) for f, c in zip(FEATURES, self.coef)}

    def as_dict(self) -> Dict:
        return {"features": list(FEATURES), "coef": [float(c) for c in self.coef], "overhead_s": float(self.overhead_s),
                "tail_s": None if self.tail_s is None else float(self.tail_s), "n_obs": self.n_obs,
                "source": self.source, "cold_key": self.cold_key, "cold_capacity": self.cold_capacity}

    @classmethod
    def from_dict(cls, d: Dict) -> "StepCostModel":
        """The inverse of :meth:`as_dict`; also reads the six-feature format of earlier profiles
        (see the module docstring)."""
        names = list(d.get("features", FEATURES))
        coef = [float(c) for c in d["coef"]]
        if len(names) != len(coef):
            raise ValueError(f"cost model has {len(coef)} coefficients for {len(names)} features")
        if set(names) <= set(FEATURES):  # the current format, or the six of earlier versions
            by = dict(zip(names, coef))
            if "decode_padding_tokens" not in by:  # saved when padding counted as context
                by["decode_padding_tokens"] = by.get("decode_context_tokens", 0.0)
        else:
            raise ValueError(f"cost model features {names} are neither {list(FEATURES)} nor the earlier "
                             f"{list(LEGACY_FEATURES)}")
        tail = d.get("tail_s")
        return cls.from_coefficients(by, n_obs=int(d.get("n_obs", 1)), source=d.get("source", "file"),
                                     overhead_s=float(d.get("overhead_s") or 0.0),
                                     tail_s=None if tail is None else float(tail),
                                     cold_key=d.get("cold_key") or "size", cold_capacity=d.get("cold_capacity"))

    def relative_error(self, records: Iterable[dict]) -> List[float]:
        """|predicted - measured| / measured for each record with a positive duration."""
        return [abs(self.predict_record(r) - r["duration_s"]) / r["duration_s"]
                for r in records if r.get("duration_s", 0) > 0]
