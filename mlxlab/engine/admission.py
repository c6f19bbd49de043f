"""What a request's KV costs, and admission by a KV memory budget.

A request whose prompt + ``max_tokens`` of KV could never fit the budget is refused at submit;
one that does not fit beside the requests already started waits (the policy does not see it)
until enough of them finish. First come, first admitted: later arrivals wait behind one that does
not fit, so a long prompt is not starved by short ones.
"""

from __future__ import annotations

from typing import Iterable, List, Optional

import mlx.core as mx
from mlx.utils import tree_flatten

from mlxlab.core.presets import module_of
from mlxlab.core.request import SequenceState
from mlxlab.engine.kvquant import check_kv_bits, kv_shape


def kv_bytes_per_token(model) -> int:
    """KV bytes one token takes across all layers, from a LoadedModel or the module's args."""
    f = getattr(model, "kv_bytes_per_token", None)
    if callable(f):
        return int(f())
    a = module_of(model).args
    heads = getattr(a, "num_key_value_heads", None) or a.num_attention_heads
    head_dim = getattr(a, "head_dim", None) or a.hidden_size // a.num_attention_heads
    dtype = next((p.dtype for _, p in tree_flatten(module_of(model).parameters())
                  if mx.issubdtype(p.dtype, mx.floating)), mx.float32)
    return 2 * a.num_hidden_layers * heads * head_dim * dtype.size


def kv_quantization(model, kv_bits: Optional[int], kv_group_size: int, quantized_kv_start: int) -> Optional[tuple]:
    """A request's KV quantization as ``(bits, group_size, quantized_kv_start)``, or None for full
    precision; ``ValueError`` for settings this backend cannot run at the model's shape."""
    if kv_bits is None:
        return None
    if not isinstance(quantized_kv_start, int) or quantized_kv_start < 0:
        raise ValueError(f"quantized_kv_start must be a non-negative integer, got {quantized_kv_start!r}")
    shape = kv_shape(model)
    check_kv_bits(kv_bits, kv_group_size, shape.pop("head_dim"), **shape)
    return int(kv_bits), int(kv_group_size), int(quantized_kv_start)


class KVBudget:
    """The engine's KV admission (see the module docstring); ``budget_bytes`` None admits all."""

    def __init__(self, model, budget_bytes: Optional[int]):
        self.model = model
        self.budget_bytes = budget_bytes
        self.full_bytes_per_token = kv_bytes_per_token(model)

    def bytes_per_token(self, kv: Optional[tuple]) -> int:
        """KV bytes per token of a request: quantized if ``kv`` says so and the model can tell
        (a LoadedModel), else the full-precision figure (an upper bound)."""
        f = getattr(self.model, "kv_bytes_per_token", None)
        if kv is not None and callable(f):
            return int(f(kv[0], kv[1]))
        return self.full_bytes_per_token

    def need(self, prompt_tokens: int, max_tokens: int, kv: Optional[tuple]) -> int:
        return (prompt_tokens + max_tokens) * self.bytes_per_token(kv)

    def check(self, prompt_tokens: int, max_tokens: int, kv: Optional[tuple]) -> None:
        """``ValueError`` for a request that could never fit the budget."""
        if self.budget_bytes is None:
            return
        need = self.need(prompt_tokens, max_tokens, kv)
        if need > self.budget_bytes:
            raise ValueError(f"this request needs {need / 2**20:.1f} MiB of KV cache ({prompt_tokens} prompt + "
                             f"{max_tokens} output tokens) but the engine's KV budget is "
                             f"{self.budget_bytes / 2**20:.1f} MiB: it could never run; shorten it, lower "
                             f"max_tokens or raise kv_budget_bytes")

    def admitted(self, queue: List[SequenceState], seqs: Iterable[SequenceState]) -> List[SequenceState]:
        """The prefill ``queue`` less the waiting sequences whose KV would not fit beside the
        started ones among ``seqs`` (every sequence of the engine)."""
        if self.budget_bytes is None:
            return queue
        committed = sum(self._need_of(s) for s in seqs if not s.req.done and _started(s))
        out = []
        for s in queue:
            if not _started(s):
                if committed + self._need_of(s) > self.budget_bytes:
                    break
                committed += self._need_of(s)
            out.append(s)
        return out

    def _need_of(self, s: SequenceState) -> int:
        return self.need(len(s.req.prompt), s.req.max_tokens, s.kv)


def _started(s: SequenceState) -> bool:
    """Holds KV already: prefill begun, or part of its prompt restored from the prefix cache."""
    return s.cache is not None or s.prefilled > 0
