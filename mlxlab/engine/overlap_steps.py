"""Overlap mode's side of the engine (``Engine(..., overlap=True)``): the main thread's step, the
jobs it hands the prefill thread (:mod:`mlxlab.engine.overlap` has the thread, the hand-over
protocol and the pacer) and the collection of their results. A mixin of
:class:`mlxlab.engine.loop.Engine`, whose state it uses; split from it to keep each module short.
"""

from __future__ import annotations

import time
from typing import List, Optional

import mlx.core as mx

from mlxlab.core.request import SequenceState, StepRecord
from mlxlab.policies import next_plan


class OverlapSteps:
    """The engine's overlap-mode methods (see the module docstring)."""

    def _step_overlap(self) -> Optional[StepRecord]:
        while True:
            self._collect()
            plan = next_plan(self.policy, self.state())
            handed = None
            if plan.prefill and not self._prefill.busy:  # a busy worker skips this step's chunks
                handed = self._new_record("prefill", self.now(), thread="prefill")
                self._prefill.hand_over(handed, self._job_chunks(plan.prefill))
            rec = None
            if plan.decode:
                pause = self._pacer.delay_s(self.now(), self._prefill.busy)
                if pause > 0:  # hand out the last tokens, then give the prefill thread the time
                    self._flush()
                    self._hand_out()
                    time.sleep(pause)
                self._pacer.started(self.now(), self._prefill.busy)
                rec = self._new_record("decode", self.now())
                self._decode(rec, defer=True)  # its tokens are read during the next step
                if not rec.decode_seqs:
                    self._drop_record(rec)
                    rec = None
            else:
                self._flush()
            if rec is not None or handed is not None:
                return rec if rec is not None else handed
            if not self._prefill.busy:
                return None
            self._hand_out()  # the tokens just read must not wait for the prefill (a chat's last one did)
            self._collect(wait=True)  # nothing could run: wait for the worker, then plan again

    def _hand_out(self) -> None:
        """Before the step blocks: let :attr:`before_wait` hand out the tokens read so far. Over
        HTTP a step that read a chat's last token and then waited for a document's prefill held
        that token back until the prefill ended: every chat's last gap was its longest, 100-400
        ms beside 4 documents where the others were 3-25 ms (``data/results/h100/serve_http_*.json``,
        ``longest_gaps``); an in-process run times tokens as they are read and never saw it."""
        if self.before_wait is not None:
            self.before_wait()

    def _job_chunks(self, prefill) -> list:
        """The plan's chunks, each followed by up to ``overlap_job_chunks - 1`` more chunks (of
        ``chunk_size``) of the same prompt: one hand-over, so the prefill thread does not wait a
        decode step for the main thread between them."""
        out = []
        for i, n in prefill:
            seq = self._seqs[i]
            out.append((seq, n))
            left = seq.prefill_tokens - seq.prefilled - n
            for _ in range(self.overlap_job_chunks - 1):
                if left <= 0:
                    break
                out.append((seq, min(self.chunk_size, left)))
                left -= out[-1][1]
        return out

    def _prefill_job(self, rec: StepRecord, chunks) -> List[SequenceState]:
        """The prefill worker's job (on its thread): run the handed-over chunks, timed in ``rec``;
        returns the sequences whose prefill finished."""
        rec.start_s = self.now()
        try:
            return [seq for seq, n in chunks if self._run_chunk(seq, n, rec, sync=self.overlap_sync)]
        finally:
            rec.end_s = self.now()

    def _first_token(self, seq: SequenceState) -> int:
        """On the main thread, as the prefill comes back: the sequence's first decode forward on its
        own cache (batch 1, no padding: what ``generate_step`` runs) and its token. That token then
        waits neither for a decode step of the batch nor for the join, which left-pads every row to
        the longest and, for a long document beside a chat, stalled the chat for two steps in the
        H200 runs (``probes/overlap_profile.py``); a one-token request never joins at all. Not on
        the prefill thread: a batch-1 forward there beside the chat's made mlx's cuDNN attention
        fail (CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER, H200). Not for quantized-KV rows (they
        decode alone anyway) or with a prefix cache (a finished row is remembered from the batch)."""
        logits = self.module(mx.array([[seq.req.prompt[-1]]]), cache=seq.cache)[:, -1, :]
        token = self._sample(logits, [seq])
        mx.eval(token, [c.state for c in seq.cache])
        return int(token.item())

    def _collect(self, wait: bool = False) -> None:
        """Take back the worker's finished job (waiting for it if ``wait``): its sequences return
        to the main thread, finished prefills become ready, its record goes to the policy."""
        done = self._prefill.collect(wait)
        if done is None:
            return
        rec, finished = done
        for seq in finished:
            self._prefill_done(seq)
            if seq.kv is None and self.prefix_cache is None:
                token = self._first_token(seq)
                seq.issued += 1
                self._deliver(rec, [seq], [token], self.now())
                if seq.req.done:  # a one-token request (or a stop token): it never joins the batch
                    self._ready.remove(seq)
                    seq.cache = None
        for seq in [s for s in self._queue + self._ready if s.req.done]:  # cancelled while the thread held them
            (self._queue if seq in self._queue else self._ready).remove(seq)
            seq.cache = None
        self._observe(rec)

    def _holds(self, seq: SequenceState) -> bool:
        return seq.req.id in self._prefill.held
