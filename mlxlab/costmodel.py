"""A step-time cost model fitted from step records (pure numpy, no MLX).

One step's time is modelled as a non-negative combination of what it does::

    t = a * [decodes] + b * decode_batch + c * decode_context_tokens
        + d * prefill_chunks + e * prefill_tokens + f * prefill_attention

``[decodes]`` is 1 if the step ran a decode forward (reading every weight once), ``decode_batch``
the sequences it advanced, ``decode_context_tokens`` the KV they read; ``prefill_chunks`` counts
chunk forwards (their fixed per-chunk cost), ``prefill_tokens`` the tokens pushed through the
linear layers, and ``prefill_attention`` the query-key pairs of the chunks' attention
(``n * context + n**2 / 2`` per chunk). The same model serves the ``slo`` policy (to choose a
chunk size) and the simulator (to charge a plan), so both read step records the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Sequence, Tuple

import numpy as np

FEATURES = ("decode_step", "decode_batch", "decode_context_tokens", "prefill_chunks",
            "prefill_tokens", "prefill_attention")


def features(decode_batch: int = 0, decode_context_tokens: int = 0,
             chunks: Sequence[Tuple[int, int]] = ()) -> np.ndarray:
    """The feature vector of a step; ``chunks`` lists (tokens, context before the chunk)."""
    return np.array([
        1.0 if decode_batch else 0.0,
        float(decode_batch),
        float(decode_context_tokens),
        float(len(chunks)),
        float(sum(n for n, _ in chunks)),
        float(sum(n * c + n * n / 2.0 for n, c in chunks)),
    ])


def record_features(rec: dict) -> np.ndarray:
    """Features of a step record dict (``StepRecord.as_dict()``). A step with several chunks
    is treated as one chunk of their summed tokens after their summed context (exact for the
    usual one-chunk step)."""
    n = rec.get("prefill_tokens", 0)
    seqs = rec.get("prefill_seqs") or []
    chunks = [(n, rec.get("prefill_context_tokens", 0))] if n else []
    f = features(rec.get("decode_batch", 0), rec.get("decode_context_tokens", 0), chunks)
    f[3] = float(len(seqs)) if n else 0.0
    return f


def _nnls(X: np.ndarray, y: np.ndarray, ridge: float) -> np.ndarray:
    """Least squares with non-negative coefficients (active set: drop negatives, refit)."""
    active = np.ones(X.shape[1], dtype=bool)
    coef = np.zeros(X.shape[1])
    for _ in range(X.shape[1]):
        Xa = X[:, active]
        A = Xa.T @ Xa + ridge * np.eye(Xa.shape[1])
        sol = np.linalg.solve(A, Xa.T @ y)
        if (sol >= 0).all():
            coef[:] = 0
            coef[active] = sol
            return coef
        idx = np.flatnonzero(active)
        active[idx[sol < 0]] = False
        if not active.any():
            break
    return coef


@dataclass
class StepCostModel:
    """Step time in seconds as a non-negative linear model of :data:`FEATURES`."""

    coef: np.ndarray = field(default_factory=lambda: np.zeros(len(FEATURES)))
    n_obs: int = 0
    source: str = "unfitted"

    @property
    def fitted(self) -> bool:
        return self.n_obs > 0

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
        coef = _nnls(X / scale, y, ridge) / scale
        return cls(coef=coef, n_obs=len(recs), source=source)

    def predict(self, decode_batch: int = 0, decode_context_tokens: int = 0,
                chunks: Sequence[Tuple[int, int]] = ()) -> float:
        """Predicted step time in seconds."""
        return float(features(decode_batch, decode_context_tokens, chunks) @ self.coef)

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

    def as_dict(self) -> Dict:
        return {"features": list(FEATURES), "coef": [float(c) for c in self.coef],
                "n_obs": self.n_obs, "source": self.source}

    @classmethod
    def from_dict(cls, d: Dict) -> "StepCostModel":
        if list(d.get("features", FEATURES)) != list(FEATURES):
            raise ValueError(f"cost model features {d.get('features')} differ from {list(FEATURES)}")
        return cls(coef=np.array(d["coef"], dtype=float), n_obs=int(d.get("n_obs", 1)),
                   source=d.get("source", "file"))

    def relative_error(self, records: Iterable[dict]) -> List[float]:
        """|predicted - measured| / measured for each record with a positive duration."""
        return [abs(self.predict_record(r) - r["duration_s"]) / r["duration_s"]
                for r in records if r.get("duration_s", 0) > 0]
