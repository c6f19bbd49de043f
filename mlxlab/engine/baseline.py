"""mlx-lm's own ``BatchGenerator`` behind the engine's executor interface.

:class:`MlxLmExecutor` lets :func:`mlxlab.core.runner.run_workload` drive mlx-lm exactly as it drives
:class:`mlxlab.Engine`, so both are measured on the same workload, model object and machine::

    from mlxlab.engine.baseline import MlxLmExecutor
    run_workload(MlxLmExecutor(model, prefill_step_size=2048), workload)

One :meth:`MlxLmExecutor.step` is one ``BatchGenerator.next()`` call: a decode step for every
decoding sequence, then (unless ``completion_batch_size`` sequences already decode) one prefill
chunk of ``prefill_step_size`` tokens for each of up to ``prefill_batch_size`` prompts, batched.
Tokens are stamped when ``next()`` returns them, i.e. when a server built on ``BatchGenerator``
could first send them, after the call's prefill chunk finished.

Differences from the engine that show up in the step records: mlx-lm runs the first forward pass
of a sequence whose prompt just finished separately from the decode batch (``GenerationBatch``
built by ``generate``); a step where that happens lists the sequences in ``joined``. mlx-lm also
reads token k while it computes token k+1, so a stream's last token costs one wasted forward.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

from mlx_lm.generate import BatchGenerator, StopSequences

from mlxlab.core.executor import Executor
from mlxlab.core.presets import model_limits, module_of
from mlxlab.core.request import (
    DECODING,
    DONE,
    PREFILLING,
    Request,
    StepRecord,
    validate_request,
)


@dataclass
class BaselineStep(StepRecord):
    """A :class:`mlxlab.core.request.StepRecord` of one ``BatchGenerator.next()`` call, plus ``joined``:
    request ids whose prompt finished in this call and whose first forward pass ran here."""

    joined: List[int] = field(default_factory=list)

    def as_dict(self) -> dict:
        d = super().as_dict()
        d["joined"] = list(self.joined)
        return d


class _Scheduler:
    """What :func:`mlxlab.core.runner.run_workload` records as the policy: BatchGenerator's own."""

    name = "mlx_lm.BatchGenerator"

    def __init__(self, text: str):
        self._text = text

    def __repr__(self) -> str:
        return self._text


class MlxLmExecutor(Executor):
    """An :class:`~mlxlab.core.executor.Executor` that runs mlx-lm's ``BatchGenerator``.

    Args:
        model: a :class:`mlxlab.engine.models.LoadedModel` or an mlx-lm ``nn.Module``.
        prefill_step_size, prefill_batch_size, completion_batch_size: ``BatchGenerator``'s own
            options (its defaults).
        sampler: maps log-probabilities (B, vocab) to token ids; greedy (argmax) by default.
        stop_tokens: token ids that end any request.

    ``requests`` are :class:`mlxlab.core.request.Request`, ``steps`` :class:`BaselineStep`.
    """

    name = "mlx_lm"

    def __init__(self, model, *, prefill_step_size: int = 2048, prefill_batch_size: int = 8,
                 completion_batch_size: int = 32, sampler: Optional[Callable] = None,
                 stop_tokens: Sequence[int] = (), clock: Callable[[], float] = time.perf_counter):
        for k, v in (("prefill_step_size", prefill_step_size), ("prefill_batch_size", prefill_batch_size),
                     ("completion_batch_size", completion_batch_size)):
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"{k} must be a positive integer, got {v!r}")
        self.model = model
        self.module = module_of(model)
        self.vocab_size, self.max_context = model_limits(model)
        self.prefill_step_size = prefill_step_size
        self.chunk_size = prefill_step_size  # what run_workload records as the chunk size
        self.prefill_batch_size = prefill_batch_size
        self.completion_batch_size = completion_batch_size
        self.stop_tokens = frozenset(int(t) for t in stop_tokens)
        self.policy = _Scheduler(repr(self))
        self.gen = BatchGenerator(self.module, sampler=sampler, prefill_step_size=prefill_step_size,
                                  prefill_batch_size=prefill_batch_size,
                                  completion_batch_size=completion_batch_size)
        self._clock = clock
        self._t0 = clock()
        self.requests: List[Request] = []
        self.steps: List[BaselineStep] = []
        self._by_uid: Dict[int, Request] = {}
        self._prefilled: Dict[int, int] = {}  # uid -> prompt tokens already in its KV cache
        self._open = 0  # submitted, not done

    def __repr__(self) -> str:
        return (f"MlxLmExecutor(prefill_step_size={self.prefill_step_size}, "
                f"prefill_batch_size={self.prefill_batch_size}, completion_batch_size={self.completion_batch_size})")

    # ------------------------------------------------------------------ public API
    def now(self) -> float:
        """Seconds since the executor was created."""
        return self._clock() - self._t0

    def submit(self, prompt_tokens, max_tokens: int = 256, *, tenant: str = "default",
               arrival_s: Optional[float] = None, stop_tokens: Sequence[int] = ()) -> Request:
        """Queue a request in the ``BatchGenerator``; raises ``ValueError`` (changing nothing) on
        the inputs :meth:`mlxlab.Engine.submit` rejects."""
        prompt = validate_request(prompt_tokens, max_tokens, self.vocab_size, self.max_context)
        stops = self.stop_tokens | frozenset(int(t) for t in stop_tokens)
        req = Request(id=len(self.requests), prompt=prompt, max_tokens=int(max_tokens), tenant=str(tenant),
                      arrival_s=self.now() if arrival_s is None else float(arrival_s), stop_tokens=stops)
        (uid,) = self.gen.insert([prompt], max_tokens=[req.max_tokens],
                                 stop_sequences=[StopSequences([[t] for t in sorted(stops)] or None)])
        self.requests.append(req)
        self._by_uid[uid] = req
        self._prefilled[uid] = 0
        self._open += 1
        return req

    @property
    def has_work(self) -> bool:
        return self._open > 0

    def step(self) -> Optional[BaselineStep]:
        """One ``BatchGenerator.next()``; its record, or None when nothing is queued."""
        if not self.has_work:
            return None
        rec = BaselineStep(len(self.steps), self.now(), 0.0, "", [], [])
        prompt_responses, gen_responses = self.gen.next()
        t = self.now()
        rec.end_s = t
        for r in prompt_responses:
            req = self._by_uid[r.uid]
            if r.end_of_prompt:  # prompt done; its first forward ran in this call
                rec.joined.append(req.id)
                req.state = DECODING
                if req.prefill_start_s is None:  # a one-token prompt: nothing to prefill
                    req.prefill_start_s = rec.start_s
                continue
            done = int(r.progress[0])
            n = done - self._prefilled[r.uid]
            if n > 0:
                rec.prefill.append((req.id, n, self._prefilled[r.uid]))
                self._prefilled[r.uid] = done
            if req.prefill_start_s is None:
                req.prefill_start_s = rec.start_s
                req.state = PREFILLING
        ctx = 0
        for r in gen_responses:
            req = self._by_uid[r.uid]
            rec.decode_seqs.append(req.id)
            ctx += len(req.prompt) + len(req.output_tokens)
            req.output_tokens.append(int(r.token))
            req.token_times_s.append(t)
            if r.finish_reason is not None:
                req.state = DONE
                req.finish_reason = r.finish_reason
                req.finish_s = t
                self._open -= 1
                del self._by_uid[r.uid], self._prefilled[r.uid]
        rec.decode_context_tokens = ctx
        decode = bool(rec.decode_seqs or rec.joined)
        rec.phase = "mixed" if (decode and rec.prefill) else ("prefill" if rec.prefill else "decode")
        self.steps.append(rec)
        return rec

    def run(self, progress: bool = False) -> List[Request]:
        """Step until every submitted request is done; returns all requests. Unlike the engine's,
        it leaves the generator open (:meth:`close` releases it) and shows no progress bar.
        Nothing is ever left in flight between calls (``next()`` returns read tokens), so there
        is nothing to flush."""
        while self.has_work:
            self.step()
        return self.requests

    def close(self) -> None:
        self.gen.close()
