"""Determinism probe: does the same greedy request give the same tokens twice on this device?

``mlxlab bench serve`` on the H200 found the HTTP path's tokens differing from the in-process
engine's, at a different position in each round, even for one stream
(``data/results/h200/serve_overhead.json``, ``first_difference``). This probe separates the
server from the device: the same prompts run ``--runs`` times in-process on fresh engines (and,
for the first prompt, through mlx-lm's ``generate_step``), one stream and ``--streams`` at once,
and it records where each run's tokens first differ from run 1's, and the gap between the two
largest logits of run 1's first decoded position (random weights leave it small: a tie a
rounding difference can flip).

Usage::

    python -m probes.determinism_probe --model tiny
    bash scripts/h200_batch.sh determinism     # on the GPU machine

Writes ``data/results/<platform>/determinism_probe.json``.
"""

from __future__ import annotations

import mlx.core as mx

from probes import common


def main(argv=None) -> int:
    p = common.parser(__doc__, "determinism_probe", model="tiny")
    p.add_argument("--prompt-tokens", type=int, default=1024)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--streams", type=int, default=16)
    p.add_argument("--runs", type=int, default=3)
    args = common.parse(p, argv)
    from mlx_lm.generate import generate_step

    from mlxlab.engine.warmup import random_prompt
    from mlxlab.studies.serving.run import first_differences, in_process

    model = common.load(args)
    vocab = model.vocab_size
    out = {"config": {k: getattr(args, k) for k in ("model", "bits", "prompt_tokens", "max_tokens", "streams", "runs")}}
    for n in (1, args.streams):
        prompts = [random_prompt(args.prompt_tokens, vocab, i) for i in range(n)]
        runs = [in_process(model, prompts, args.max_tokens)["tokens"] for _ in range(args.runs)]
        out[f"streams_{n}"] = {"first_difference_vs_run1": [first_differences(r, runs[0]) for r in runs[1:]]}
        common.log("determinism", f"{n} stream(s): first differences vs run 1 {out[f'streams_{n}']}")
    prompt = mx.array(random_prompt(args.prompt_tokens, vocab, 0))
    ref = []
    for _ in range(2):
        steps = generate_step(prompt, model.module, max_tokens=args.max_tokens)
        ref.append([int(t) for t, _ in steps])
    single = [in_process(model, [list(map(int, prompt.tolist()))], args.max_tokens)["tokens"][0] for _ in range(2)]
    logits = model.module(prompt[None])[0, -1].astype(mx.float32)
    top2 = mx.topk(logits, 2)
    mx.eval(top2)
    vals = sorted(top2.tolist(), reverse=True)
    out["generate_step"] = {"first_difference_run2_vs_run1": first_differences([ref[1]], [ref[0]])[0],
                            "engine_vs_generate_step": first_differences(single, [ref[0], ref[0]]),
                            "top2_logit_gap_first_token": vals[0] - vals[1], "top_logit": vals[0]}
    common.log("determinism", f"generate_step: {out['generate_step']}")
    common.save(args, "determinism", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
