"""The inference engine on mlx-lm models.

* ``loop``: :class:`Engine`, the step loop (policy plan -> batched decode, chunked prefill);
* ``batch``: the decode batch's caches, a prompt's own cache, layer-by-layer evaluation;
* ``overlap``: overlap mode's prefill worker thread;
* ``admission``: KV bytes per request, KV-budget admission;
* ``fused``: a decode step and prefill chunks in one packed forward;
* ``warmup``, ``kvquant``, ``prefix_cache``, ``speculative``, ``models``: warm-up, quantized KV,
  prefix reuse, draft-then-verify decoding, model loading;
* ``baseline``: mlx-lm's own ``BatchGenerator`` behind the same executor interface;
* ``disagg``, ``disagg_wire``: a prefill worker and a decode worker in two processes over
  ``mx.distributed`` (the KV of each prefilled prompt sent to the decode batch).
"""

import warnings

from mlxlab.core.environment import slow_blas_warning
from mlxlab.engine.loop import Engine

__all__ = ["Engine"]

# the engine is where mlx first runs: warn once if it would run on the slow reference BLAS
if (_why := slow_blas_warning()) is not None:
    warnings.warn(_why, RuntimeWarning, stacklevel=2)
