"""Greedy speculative decoding for one stream, and its analytic model.

A draft model proposes ``k`` tokens one at a time; the target scores the last accepted token
plus the ``k`` proposals in one pass and keeps the longest prefix on which its own greedy choice
agrees, plus one token of its own (the correction, or a bonus token when all ``k`` agree). The
output is token-for-token the target's greedy output; only the number of target passes changes.

Analytic model (each draft token accepted independently with probability ``a``; a draft step
costs ``c`` target decode steps; the verification pass of ``k + 1`` tokens costs ``v`` target
steps, ``v = 1`` in the textbook model)::

    tokens per target pass  E(a, k) = (1 - a**(k + 1)) / (1 - a)
    speedup                 S(a, k, c, v) = E(a, k) / (k * c + v)

:func:`speculative_generate` records what the model needs (the accept/reject record of every
round, draft and verification time); :mod:`mlxlab.studies.speculation.run` measures ``a``, ``c``,
``v`` and the end-to-end speedup against mlx-lm's target-alone ``generate_step``.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable, List, Optional, Sequence

import mlx.core as mx
from mlx_lm.generate import generate_step, speculative_generate_step
from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache

from mlxlab.core.presets import model_limits, module_of

# --------------------------------------------------------------------------- analytic model


def expected_tokens_per_pass(a: float, k: int) -> float:
    """Expected tokens produced per target pass with ``k`` drafts accepted i.i.d. with prob. ``a``:
    ``(1 - a^(k+1)) / (1 - a)``; 1 at ``a = 0``, ``k + 1`` at ``a = 1``."""
    if not 0.0 <= a <= 1.0:
        raise ValueError(f"acceptance rate must be in [0, 1], got {a}")
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    if a == 1.0:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def analytic_speedup(a: float, k: int, c: float, v: float = 1.0) -> float:
    """Speedup of speculative over target-alone decoding:
    ``(1 - a^(k+1)) / ((1 - a) (k c + v))``, ``c`` = draft step / target step cost, ``v`` = cost
    of the (k+1)-token verification pass in target steps (1 in the textbook formula)."""
    return expected_tokens_per_pass(a, k) / (k * c + v)


def breakeven_cost_ratio(a: float, k: int, v: float = 1.0) -> float:
    """The draft cost ratio ``c`` below which speculation with ``k`` drafts pays (speedup > 1);
    negative when it cannot pay at any ``c``."""
    if k <= 0:
        raise ValueError("k must be >= 1")
    return (expected_tokens_per_pass(a, k) - v) / k


def best_k(a: float, c: float, ks: Iterable[int] = range(1, 17), v=1.0) -> tuple:
    """``(k, speedup)`` maximising :func:`analytic_speedup` over ``ks``; ``v`` a number or a
    function of ``k``. ``k = 0`` (no speculation, speedup 1) wins when nothing pays."""
    best = (0, 1.0)
    for k in ks:
        s = analytic_speedup(a, k, c, v(k) if callable(v) else v)
        if s > best[1]:
            best = (k, s)
    return best


def estimate_acceptance(rounds: Sequence[tuple]) -> float:
    """Maximum-likelihood per-token acceptance probability of the i.i.d. model from
    ``(k, n_accepted)`` rounds: each round tests drafts until the first rejection, so
    ``a = sum(n) / sum(n + [n < k])``. (accepted / proposed underestimates ``a``: drafts after a
    rejection are proposed but never tested.)"""
    acc = sum(n for k, n in rounds if k > 0)
    rej = sum(1 for k, n in rounds if k > 0 and n < k)
    return acc / (acc + rej) if acc + rej else float("nan")


# --------------------------------------------------------------------------- decoding


def prefill_cache(model, cache, tokens: List[int], step: int = 512) -> None:
    """Run ``tokens`` through ``model`` into ``cache`` in chunks of ``step``, evaluated."""
    for i in range(0, len(tokens), step):
        model(mx.array(tokens[i:i + step], mx.uint32)[None], cache=cache)
        mx.eval([c.state for c in cache])


def speculative_generate(target, draft, prompt_tokens: Sequence[int], max_tokens: int = 128,
                         num_draft_tokens: int = 4, *, prefill_step_size: int = 512) -> dict:
    """Greedy speculative decoding of ``max_tokens`` tokens after ``prompt_tokens``.

    ``target`` / ``draft``: :class:`mlxlab.LoadedModel` or mlx-lm modules sharing a vocabulary.
    Each round the draft proposes ``k = min(num_draft_tokens, tokens still needed - 1)`` tokens,
    the target verifies them in one pass of ``k + 1`` tokens, and both KV caches are trimmed
    back to the accepted prefix (``trim_prompt_cache``). ``num_draft_tokens=0`` is plain greedy
    decoding, one target pass per token.

    Returns a dict: ``tokens`` (list, equal to the target's greedy output), ``accepted`` /
    ``proposed`` draft tokens, ``target_passes``, ``draft_steps`` (draft forward calls),
    ``rounds`` (list of ``(k, n_accepted)``), ``acceptance_rate`` (accepted / proposed), ``a_hat``
    (:func:`estimate_acceptance`), ``tokens_per_pass`` and ``times`` in seconds (``prefill``
    of both models, ``draft`` and ``verify`` summed over rounds, ``decode`` = everything after
    prefill, ``total``).
    """
    tm, dm = module_of(target), module_of(draft)
    prompt = [int(t) for t in prompt_tokens]
    if not prompt:
        raise ValueError("empty prompt")
    k_max = int(num_draft_tokens)
    if k_max < 0:
        raise ValueError("num_draft_tokens must be >= 0")
    t_start = time.perf_counter()
    tc = make_prompt_cache(tm)
    dc = make_prompt_cache(dm) if k_max > 0 else None
    prefill_cache(tm, tc, prompt[:-1], prefill_step_size)
    if dc is not None:
        prefill_cache(dm, dc, prompt[:-1], prefill_step_size)
    t_prefill = time.perf_counter()

    out: List[int] = []
    rounds: List[tuple] = []
    last = prompt[-1]        # newest token, not yet in the target cache
    pending = [last]         # tokens not yet in the draft cache
    draft_s = verify_s = 0.0
    while len(out) < max_tokens:
        k = min(k_max, max_tokens - len(out) - 1)
        t0 = time.perf_counter()
        d = _propose(dm, dc, pending, k) if k > 0 else []
        t1 = time.perf_counter()
        t = _verify(tm, tc, [last] + d)
        draft_s += t1 - t0
        verify_s += time.perf_counter() - t1
        n = 0
        while n < k and t[n] == d[n]:
            n += 1
        out.extend(t[:n + 1])          # d[:n] == t[:n], then the target's own token
        rounds.append((k, n))
        pending = _rewind(tc, dc, pending, d, t, n)
        last = t[n]
    t_end = time.perf_counter()
    accepted = sum(n for _, n in rounds)
    proposed = sum(k for k, _ in rounds)
    return {
        "tokens": out,
        "num_draft_tokens": k_max,
        "accepted": accepted,
        "proposed": proposed,
        "target_passes": len(rounds),
        "draft_steps": proposed,  # one draft forward per proposed token
        "rounds": rounds,
        "acceptance_rate": accepted / proposed if proposed else float("nan"),
        "a_hat": estimate_acceptance(rounds),
        "tokens_per_pass": len(out) / len(rounds) if rounds else float("nan"),
        "times": {"prefill": t_prefill - t_start, "draft": draft_s, "verify": verify_s,
                  "decode": t_end - t_prefill, "total": t_end - t_start},
    }


def _argmax(logits: mx.array) -> mx.array:
    return mx.argmax(logits, axis=-1)


def _propose(draft, cache, pending: List[int], k: int, sample: Callable = _argmax) -> List[int]:
    """``k`` draft tokens (``sample``: logits (n, vocab) -> ids (n,), greedy by default), after
    feeding ``pending`` (the tokens the draft cache lacks)."""
    x = mx.array(pending, mx.uint32)
    ds = []
    for _ in range(k):
        logits = draft(x[None], cache=cache)
        x = sample(logits[0, -1:, :]).astype(mx.uint32)
        mx.async_eval(x)
        ds.append(x)
    proposed = mx.concatenate(ds)
    mx.eval(proposed)
    return proposed.tolist()


def _verify(target, cache, tokens: List[int], sample: Callable = _argmax) -> List[int]:
    """The target's choice (greedy by default) after each of ``tokens`` (the last accepted token,
    then the drafts), in one pass."""
    choice = sample(target(mx.array(tokens, mx.uint32)[None], cache=cache)[0])
    mx.eval(choice)
    return choice.tolist()


def _rewind(target_cache, draft_cache, pending: List[int], d: List[int], t: List[int], n: int) -> List[int]:
    """Trim both caches back to the ``n`` accepted drafts of ``d``; returns the tokens the draft
    cache now lacks (it saw neither the target's own token nor, when all were accepted, the last
    draft)."""
    k = len(d)
    if k - n:
        trim_prompt_cache(target_cache, k - n)
    if k == 0:  # no draft this round: the draft cache saw nothing
        return pending + [t[0]]
    if n < k:
        # the draft cache holds pending + d[:k-1]; keep pending + d[:n]
        trim_prompt_cache(draft_cache, k - 1 - n)
        return [t[n]]
    return [d[-1], t[k]]


def target_generate(target, prompt_tokens: Sequence[int], max_tokens: int = 128) -> dict:
    """Target-alone greedy decoding with mlx-lm's ``generate_step`` (the baseline), timed:
    ``tokens``, ``times`` (``first`` = prompt processing + first token, ``decode`` = the other
    ``max_tokens - 1`` tokens, ``total``)."""
    tm = module_of(target)
    t0 = time.perf_counter()
    t_first = None
    toks: List[int] = []
    for (tok, _), _i in zip(generate_step(mx.array(list(prompt_tokens), mx.uint32), tm,
                                          max_tokens=max_tokens), range(max_tokens)):
        toks.append(int(tok))
        if t_first is None:
            t_first = time.perf_counter()
    t_end = time.perf_counter()
    return {"tokens": toks, "times": {"first": t_first - t0, "decode": t_end - t_first,
                                      "total": t_end - t0}}


def mlx_lm_speculative(target, draft, prompt_tokens: Sequence[int], max_tokens: int = 128,
                       num_draft_tokens: int = 4) -> dict:
    """The same run through mlx-lm's ``speculative_generate_step`` (for comparison):
    ``tokens``, ``accepted`` (tokens flagged as from the draft), ``times``."""
    t0 = time.perf_counter()
    toks, acc = [], 0
    for tok, _, from_draft in speculative_generate_step(
            mx.array(list(prompt_tokens), mx.uint32), module_of(target), module_of(draft),
            num_draft_tokens=num_draft_tokens, max_tokens=max_tokens):
        toks.append(int(tok))
        acc += bool(from_draft)
    return {"tokens": toks, "accepted": acc, "times": {"total": time.perf_counter() - t0}}


# --------------------------------------------------------------------------- the engine's lane

MAX_DRAFT_TOKENS = 32  # the most draft tokens a request may ask for per round


def check_draft(target, draft) -> tuple:
    """``(draft module, draft context)`` for the engine, ``(None, None)`` without a draft; raises
    ``ValueError`` unless ``draft`` can draft for ``target``: the same vocabulary size (token ids
    mean the same), and KV caches both can trim (a rejected draft's positions are cut back off, as
    in mlx-lm's ``speculative_generate_step``)."""
    if draft is None:
        return None, None
    tv, (dv, context) = model_limits(target)[0], model_limits(draft)
    if tv != dv:
        raise ValueError(f"the draft model's vocabulary ({dv} tokens) differs from the target's ({tv}): a draft "
                         f"must share the target's tokenizer and vocabulary")
    for name, m in (("target", target), ("draft", draft)):
        if not can_trim_prompt_cache(make_prompt_cache(module_of(m))):
            raise ValueError(f"the {name} model's KV cache cannot be trimmed (sliding-window or state-space "
                             f"layers), so rejected drafts could not be taken back: no speculative decoding")
    return module_of(draft), context


def draft_tokens(num_draft_tokens, draft, kv, draft_context: Optional[int], tokens: int) -> Optional[int]:
    """A request's ``num_draft_tokens`` checked: None or 0 (no speculation) -> None, else the
    number; ``ValueError`` saying what to do when it cannot run (no draft model, with ``kv``
    quantization, ``tokens`` = prompt + max_tokens over the draft's context)."""
    k = num_draft_tokens
    if k is None or (k == 0 and isinstance(k, int) and not isinstance(k, bool)):
        return None
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_DRAFT_TOKENS:
        raise ValueError(f"num_draft_tokens must be an integer from 0 to {MAX_DRAFT_TOKENS}, got {k!r}")
    if draft is None:
        raise ValueError("num_draft_tokens needs a draft model, and this engine has none (Engine(draft_model=...), "
                         "mlxlab serve --draft-model)")
    if kv is not None:
        raise ValueError("num_draft_tokens cannot be combined with kv_bits: send one or the other")
    if tokens > draft_context:
        raise ValueError(f"the prompt plus max_tokens ({tokens} tokens) exceeds the draft model's context of "
                         f"{draft_context} tokens: shorten them or send no num_draft_tokens")
    return int(k)


def speculate(rows, lanes: dict, target, draft, rec, sample: Callable) -> list:
    """The engine's speculative rows (``rows``: sequence states, ``lanes``: request id -> lane)
    each run one :meth:`DraftLane.round`, evaluated (acceptance needs the tokens), after the
    previous step's tokens were read; ``sample(logits, rows)`` is the engine's. Notes each in the
    step record ``rec`` and counts its drafts on its request; returns their tokens in the form of
    the step's decode groups, ``[(tokens, [row] * len(tokens))]``, read with the batch's."""
    groups = []
    for s in rows:
        lane = lanes.get(s.req.id)
        if lane is None or not s.active:
            continue
        rec.decode_seqs.append(s.req.id)
        rec.decode_context_tokens += s.context_tokens
        toks = lane.round(target, draft, s.cache, s.req.max_tokens - s.issued,
                          lambda logits, s=s: sample(logits, [s] * logits.shape[0]))
        s.issued += len(toks)
        s.req.draft_proposed, s.req.draft_accepted = lane.proposed, lane.accepted
        groups.append((mx.array(toks), [s] * len(toks)))
    return groups


class DraftLane:
    """One request decoding speculatively in the engine, in its own lane beside the batch (as a
    quantized-KV request does): the target's KV is the request's own cache (it never joins the
    batch cache), the draft's is this lane's. Each :meth:`round` is :func:`speculative_generate`'s
    round: the draft proposes up to ``k`` tokens, the target scores them in one pass, both caches
    are trimmed back to the accepted prefix, and the accepted drafts plus the target's own token
    come out, so greedy output is the target's greedy output.

    :meth:`start` prefills the draft on the prompt when the request starts decoding (the target's
    chunks are the policy's; the draft is small, so its whole prompt runs as one step's work)."""

    def __init__(self, k: int):
        self.k = k
        self.cache = None
        self.last = self.pending = None
        self.accepted = self.proposed = 0

    def start(self, draft, prompt: List[int], outputs: List[int], step: int) -> None:
        """The draft's cache gets ``prompt[:-1]``; ``outputs``: tokens already read (overlap mode
        samples the first one as the prefill comes back)."""
        self.cache = make_prompt_cache(draft)
        prefill_cache(draft, self.cache, prompt[:-1], step)
        self.pending = [prompt[-1]] + list(outputs)  # tokens the draft cache lacks
        self.last = outputs[-1] if outputs else prompt[-1]  # newest token, not yet in the target cache

    def round(self, target, draft, target_cache, remaining: int, sample: Callable) -> List[int]:
        """One round of at most ``remaining`` tokens (1 to ``k + 1``)."""
        k = min(self.k, remaining - 1)
        d = _propose(draft, self.cache, self.pending, k, sample) if k > 0 else []
        t = _verify(target, target_cache, [self.last] + d, sample)
        n = 0
        while n < k and t[n] == d[n]:
            n += 1
        self.pending = _rewind(target_cache, self.cache, self.pending, d, t, n)
        self.last = t[n]
        self.accepted += n
        self.proposed += k
        return t[:n + 1]
