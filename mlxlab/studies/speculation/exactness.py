"""Does speculative decoding keep the target's greedy output, and where it does not, why?

:func:`greedy_exactness` compares the target's one-token greedy decoding with our speculation and
mlx-lm's, and the one-token logits with a teacher-forced pass over the same tokens (issue 20: on
the H200 bfloat16 logits tie, and a longer pass breaks the tie the other way;
``scripts/spec_exactness.py`` runs it per dtype)."""

from __future__ import annotations

from typing import Optional, Sequence

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

from mlxlab.core.presets import module_of
from mlxlab.engine.speculative import mlx_lm_speculative, speculative_generate, target_generate


def greedy_exactness(target, draft, prompts: Sequence[Sequence[int]], *, k: int = 4,
                     max_tokens: int = 64, mlx_lm: bool = True) -> dict:
    """Whether speculation reproduces the target's own greedy output, and why not where it does not.

    Per prompt: the target alone (mlx-lm ``generate_step``, one token per pass), our speculative
    decoding and (``mlx_lm``) mlx-lm's ``speculative_generate_step`` at draft length ``k``; for each
    speculative output the first position where it leaves the target's greedy tokens. Then one
    teacher-forced pass of the target over prompt + greedy output: ``flip_positions`` counts the
    positions whose argmax there differs from the token the one-token pass chose (the same model
    and context, computed by a longer matmul), and ``margins_at_flips`` the one-token pass's
    top-1 minus top-2 logit there. Flips with margins near the dtype's rounding step mean the
    differences come from the kernels' arithmetic, not from the speculation's bookkeeping."""
    tm = module_of(target)
    per_prompt, flips, margins, positions = [], 0, [], 0
    for p in prompts:
        ref = target_generate(target, p, max_tokens)["tokens"]
        ours = speculative_generate(target, draft, p, max_tokens, k)["tokens"]
        rec = {"ours_identical": ours == ref, "ours_first_diff": _first_diff(ours, ref)}
        if mlx_lm:
            theirs = mlx_lm_speculative(target, draft, p, max_tokens, k)["tokens"]
            rec.update(mlx_lm_identical=theirs == ref, mlx_lm_first_diff=_first_diff(theirs, ref))
        # the one-token pass's logits at each greedy step, then the teacher-forced ones
        seq = list(p) + ref
        logits_tf = tm(mx.array([seq[:-1]], mx.uint32))[0, len(p) - 1:].astype(mx.float32)
        step = _stepwise_logits(tm, p, ref)
        tf_arg = np.array(mx.argmax(logits_tf, axis=-1))
        ref_arr = np.array(ref)
        bad = np.nonzero(tf_arg != ref_arr)[0]
        rec["flips"] = int(len(bad))
        for j in bad:
            top2 = np.sort(step[j])[-2:]
            margins.append(float(top2[1] - top2[0]))
        rec["max_abs_logit_diff"] = float(np.max(np.abs(np.array(logits_tf) - step)))
        flips += len(bad)
        positions += len(ref)
        per_prompt.append(rec)
    out = {"k": k, "max_tokens": max_tokens, "num_prompts": len(prompts),
           "dtype": str(getattr(target, "dtype", "")),
           "ours_identical": sum(r["ours_identical"] for r in per_prompt),
           "flip_positions": flips, "positions": positions,
           "margins_at_flips": margins,
           "max_abs_logit_diff": max(r["max_abs_logit_diff"] for r in per_prompt) if per_prompt else 0.0,
           "per_prompt": per_prompt}
    if mlx_lm:
        out["mlx_lm_identical"] = sum(r["mlx_lm_identical"] for r in per_prompt)
    return out


def _first_diff(a: Sequence[int], b: Sequence[int]) -> Optional[int]:
    """The first index where ``a`` and ``b`` differ (None when equal)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _stepwise_logits(tm, prompt: Sequence[int], tokens: Sequence[int]) -> np.ndarray:
    """The target's float32 logits for each of ``tokens``, computed as decoding does: the prompt
    in one pass, then one token per pass with a KV cache."""
    cache = make_prompt_cache(tm)
    out = [tm(mx.array([list(prompt)], mx.uint32), cache=cache)[0, -1]]
    for t in tokens[:-1]:
        out.append(tm(mx.array([[t]], mx.uint32), cache=cache)[0, -1])
    return np.array(mx.stack(out).astype(mx.float32))
