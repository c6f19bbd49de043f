"""SLO-aware chunking: the largest chunk whose predicted step time meets an ITL target."""

from __future__ import annotations

from typing import List, Optional, Sequence

from mlxlab.core.costmodel import StepCostModel  # numpy only: policies stay free of MLX
from mlxlab.core.plan import KEY_ALIGN, SchedulerState, StepPlan, align_chunk
from mlxlab.policies.base import Policy

#: overlap_job_chunks that hands a whole prompt to the prefill thread in one job
WHOLE_PROMPT = 1 << 20
#: which waiting prompt the policy prefills next (class docstring, "Which prompt")
ORDERS = ("shortest", "arrival")
#: the newest chunk choices kept in ``chosen`` (for plots; a server runs for days)
CHOSEN_KEEP = 100_000


class SLOChunking(Policy):
    """Chunk size chosen per step from a cost model of step time: while interactive streams
    decode, the largest chunk whose predicted step (decode + chunk) keeps their inter-token
    latency under ``itl_target_s``; with nobody decoding, ``max_chunk``.

    ``itl_target_s`` None (the default) sets the target relative to the device: ``itl_target_x``
    times the cost model's decode-only step for the same decode batch and contexts, i.e. "the
    chat's ITL at most twice its solo ITL" wherever it runs. A fixed 50 ms target (the old
    default) let 2,048-token chunks through on an H200, where a solo decode step takes 3-9 ms.

    The cost model (:class:`mlxlab.core.costmodel.StepCostModel`) is refitted from the executor's own
    step records every ``refit_every`` observations; until it has ``min_observations`` it plays
    safe with ``min_chunk``. A pre-fitted model (from ``mlxlab profile``) can be passed in.
    ``interactive_tenants`` limits whose decoding counts (default: every decoding stream).

    When even a ``min_chunk`` step is predicted over the target, no chunk size can meet it, and
    the choice is a trade-off. Where a prefill forward has a large fixed cost (a GPU, where a small
    chunk beside a decode costs several decodes), crawling at ``min_chunk`` multiplies the
    prompt's TTFT by its chunk count and still misses the target. Where it has almost none (a
    CPU, whose cost per token hardly depends on the chunk), ``min_chunk`` loses little
    throughput and keeps the ITL lowest. So the policy takes the smallest chunk
    whose predicted prefill cost per token is within ``1 / infeasible_efficiency`` of the
    cheapest per-token cost over the chunk range (:meth:`StepCostModel.efficient_chunk`): past
    the knee where the fixed cost stops dominating, and no further.

    A model learned online only knows the chunk sizes the policy has chosen: fitted on steps that
    all carried 4 tokens, its per-token slope is a guess, and a whole 2,048-token prompt chosen as
    one chunk on its say-so once stalled the chat for 4 s (CPU, ``min_chunk=4``). While learning, the policy therefore
    chooses at most twice the largest chunk its fitting window has seen, growing as it observes.

    ``chunk_multiple`` rounds each chosen chunk down to a multiple of it (never below
    ``min_chunk``). A backend that prepares work per query length (mlx's CUDA attention and
    matmuls) pays that again for every new size; a grid keeps the sizes few. ``key_align`` then
    cuts the chunk so it ends on a key length that is a multiple of it (:func:`align_chunk`).

    **Beside decode.** On a GPU, no serial step meets the target at any chunk size: a chunk next
    to a decode step costs several decode steps (every H200 preset, ``infeasible_fraction`` 1.0 in
    ``data/results/h200/scheduling_slo.json``), and the choice the model makes varies from step
    to step, so every step meets new (query, key) shapes and pays mlx CUDA's first-use cost for
    them (cuDNN attention graphs, about 50 ms each), which put slo with its defaults at 12-23x the
    chat's solo ITL p99 and 10-14x the document's TTFT
    (``data/results/h200/contention_before_slo_overlap.json``), behind
    every fixed setting. Running the prefill on a stream of its own beside the decode steps kept
    the chat within 0.9-4.1x (llama-3.2-1b the highest) at 1.1-1.4x the document's TTFT. So :attr:`side_prefill` asks an
    engine left to choose (``Engine(overlap=None)``) on a GPU for that mode, layers pipelined and
    the whole prompt in one hand-over (the settings that came closest to both bounds there). A
    chunk planned beside decode then does not lengthen the decode step, and the policy plans
    ``max_chunk`` and stops observing steps: every step's record and the model's refits run on the
    chat's thread and decide nothing there. (Against the same mode without slo, slo's chat ITL p99
    was 0.84-1.29x in five H200 comparisons, ``contention.json`` and ``contention_chunks.json``:
    within the runs' spread, but the work was pure overhead.)

    **Which prompt.** With ``order="shortest"`` (the default) the prompt with the fewest tokens
    left to prefill goes first, ties in arrival order: a chat turn posted behind queued documents
    is served before them, and a started document before fresh ones of its length. In arrival
    order a chat turn waits for every document posted before it (the chat's TTFT beside four
    document clients in ``data/results/*/serve_http*.json``, from ``bench http``, was the
    documents' queue, not the chat's prompt). A long prompt then waits while shorter ones keep
    coming: where short prompts alone fill the device it can starve; ``order="arrival"`` keeps
    arrival order."""

    name = "slo"
    side_prefill = {"overlap_sync": "pipelined", "overlap_job_chunks": WHOLE_PROMPT}

    def __init__(self, itl_target_s: Optional[float] = None, min_chunk: int = 32, max_chunk: int = 2048,
                 cost_model=None, interactive_tenants: Optional[Sequence[str]] = None,
                 refit_every: int = 16, min_observations: int = 8, history: int = 512,
                 infeasible_efficiency: float = 0.5, chunk_multiple: int = 1, key_align: int = KEY_ALIGN,
                 itl_target_x: float = 2.0, order: str = "shortest"):
        if key_align < 1:
            raise ValueError(f"key_align must be >= 1 (1: chunks as chosen), got {key_align}")
        if itl_target_s is not None and itl_target_s <= 0:
            raise ValueError(f"itl_target_s must be positive (or None: relative to the decode step), got {itl_target_s}")
        if itl_target_x <= 1:
            raise ValueError(f"itl_target_x must be above 1 (the target as a multiple of a decode-only step), "
                             f"got {itl_target_x}")
        if chunk_multiple < 1:
            raise ValueError(f"chunk_multiple must be >= 1, got {chunk_multiple}")
        if order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS} (which waiting prompt goes first), got {order!r}")
        if not 0 < infeasible_efficiency <= 1:
            raise ValueError(f"infeasible_efficiency must be in (0, 1] (the share of the best prefill throughput "
                             f"to keep when the ITL target cannot be met), got {infeasible_efficiency}")
        if not 1 <= min_chunk <= max_chunk:
            raise ValueError(f"need 1 <= min_chunk <= max_chunk, got {min_chunk}, {max_chunk}")
        self.itl_target_s = itl_target_s
        self.itl_target_x = float(itl_target_x)
        self.min_chunk, self.max_chunk = min_chunk, max_chunk
        self.order = order
        self.cost_model = cost_model or StepCostModel()
        self._learn = cost_model is None
        self.interactive_tenants = set(interactive_tenants) if interactive_tenants else None
        self.refit_every, self.min_observations, self.history = refit_every, min_observations, history
        self.infeasible_efficiency = float(infeasible_efficiency)
        self._largest_seen = 0  # largest chunk in the fitting window (the learned model's trust region)
        self.chunk_multiple = int(chunk_multiple)
        self.key_align = int(key_align)
        self._records: List[dict] = []
        self.chosen: List[int] = []  # chunk sizes chosen while streams decoded (for plots)
        self.infeasible_steps = 0  # of those, how many had no chunk size meeting the target

    def observe(self, record: dict) -> None:
        if not self._learn:
            return
        self._records.append(record)
        del self._records[:-self.history]
        if len(self._records) >= self.min_observations and len(self._records) % self.refit_every == 0:
            self.cost_model = StepCostModel.fit(self._records, source="online")
            self._largest_seen = max(int(r.get("prefill_tokens", 0) or 0) for r in self._records)

    def _interactive(self, state: SchedulerState) -> bool:
        if self.interactive_tenants is None:
            return bool(state.decoding)
        return any(s.tenant in self.interactive_tenants for s in state.decoding)

    def schedule(self, state: SchedulerState) -> StepPlan:
        plan = StepPlan(decode=bool(state.decoding))
        if not state.prefill_queue:
            return plan
        s = self.next_prompt(state.prefill_queue)
        if state.side_prefill:  # nothing for the chunk to delay, and nothing to learn
            self.observes = False  # stops the step records and the refits on the chat's thread
            n = self.max_chunk
        elif not self._interactive(state):
            n = self.max_chunk
        elif not self.cost_model.fitted:
            n = self.min_chunk
        else:
            batch, ctx, at = len(state.decoding), sum(d.context_tokens for d in state.decoding), s.prefilled_tokens
            hi = self.max_chunk
            if self._learn:  # no extrapolation far past what the model has seen (class docstring)
                hi = min(hi, max(self.min_chunk, 2 * self._largest_seen))
            target = self.target_s(batch, ctx)
            feasible = self.cost_model.predict(batch, ctx, [(self.min_chunk, at)]) <= target
            if feasible:
                n = self.cost_model.largest_chunk(target, batch, ctx, at, self.min_chunk, hi)
            else:  # the target cannot be met: see the class docstring
                self.infeasible_steps += 1
                n = self.cost_model.efficient_chunk(batch, ctx, at, self.min_chunk, hi, self.infeasible_efficiency)
            if self.chunk_multiple > 1:
                n = max(self.min_chunk, n - n % self.chunk_multiple)
            n = min(n, s.remaining_prefill)
            # a budget is an upper bound (align down); the knee a lower one (align up)
            n = align_chunk(n, s, self.key_align, up=not feasible) or n
            self.chosen.append(n)
            if len(self.chosen) > 2 * CHOSEN_KEEP:  # bounded in a long-running server
                del self.chosen[:-CHOSEN_KEEP]
        n = min(n, s.remaining_prefill)
        plan.prefill.append((s.seq_id, align_chunk(n, s, self.key_align) or n))  # (idempotent when aligned above)
        return plan

    def next_prompt(self, queue: Sequence) -> "object":
        """The prompt to prefill next (class docstring, "Which prompt"); ``queue`` is in arrival order."""
        if self.order == "arrival":
            return queue[0]
        return min(queue, key=lambda s: s.remaining_prefill)  # min keeps the first of equals

    def target_s(self, decode_batch: int, decode_context_tokens: int) -> float:
        """The ITL target for a step with this decode batch: ``itl_target_s``, or ``itl_target_x``
        times the fitted model's decode-only step."""
        if self.itl_target_s is not None:
            return self.itl_target_s
        return self.itl_target_x * self.cost_model.predict(decode_batch, decode_context_tokens, [])

    def __repr__(self) -> str:
        target = self.itl_target_s if self.itl_target_s is not None else f"{self.itl_target_x:g}x decode step"
        return (f"SLOChunking(itl_target_s={target}, min_chunk={self.min_chunk}, "
                f"max_chunk={self.max_chunk}, infeasible_efficiency={self.infeasible_efficiency}, "
                f"chunk_multiple={self.chunk_multiple}, key_align={self.key_align}, "
                f"order={self.order!r})")
