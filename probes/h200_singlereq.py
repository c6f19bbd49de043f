"""Single-request features on a GPU without papermill (the H200 image has none): cold and warm
first-request TTFT per preset in fresh processes, the KV-quantization probe and speed sweep, and
prefix restore against prefill at 2k/8k/23k tokens (the measurements notebooks 02, 04 and 06
make where papermill runs).

Usage::

    bash scripts/h200_batch.sh singlereq                       # the H200 run
    python -m probes.h200_singlereq --parts kv --model small   # one part, here

Writes ``data/results/<platform>/{warmup_memory,kv_quantization,prefix_cache}.json``.
"""

from __future__ import annotations

import sys

import pandas as pd

from mlxlab.engine.kvquant import probe_model
from mlxlab.studies.kv_quant.run import speed_sweep
from mlxlab.studies.prefill_step.run import fresh_process_run
from mlxlab.studies.prefix_cache.run import measure_restore, warm_vs_cold_ttft
from probes import common

PARTS = ("warmup", "kv", "restore")
LENGTHS = (2048, 8192, 23000)  # restore and warm-turn prefixes


def parse_args(argv=None):
    p = common.parser(__doc__, None, model="qwen2.5-coder-1.5b")
    p.set_defaults(bits=4)
    p.add_argument("--presets", nargs="+", default=["qwen2.5-0.5b", "llama-3.2-1b", "qwen2.5-coder-1.5b"],
                   help="the warm-up part's presets")
    p.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS)
    return common.parse(p, argv)


def warmup(args) -> None:
    """First-request TTFT in a fresh process per preset and warm-up mode."""
    runs = []
    for preset in args.presets:
        for mode in ("off", "token", "shapes"):
            r = fresh_process_run(preset, warmup_mode=mode, prompt_tokens=480, chunks=(512, 2048), batches=(4, 8),
                                  repeats=3, bits=args.bits)
            runs.append(r)
            ev = pd.DataFrame(r["events"])
            common.log("singlereq", f"{preset} {mode} first {ev.ttft_s.iloc[0]:.3f} s, warm "
                                    f"{ev[ev.event == 'warm request'].ttft_s.median():.3f} s")
    common.save(args, "warmup_memory", {"presets": args.presets, "bits": args.bits, "runs": runs},
                name="warmup_memory")


def kv(args, model) -> None:
    """Whether the backend runs a quantized KV cache, and decode speed by context and KV bits."""
    probes = {str(b): probe_model(model, b, 64) for b in (8, 4)}
    common.log("singlereq", f"kv probes: {probes}")
    sweep = speed_sweep(model, [512, 2048, 8192, 16384], (None, 8, 4), decode_tokens=64, repeats=3, progress=False)
    print(sweep.groupby(["context_tokens", "kv_bits"], dropna=False).decode_tok_s.median(), flush=True)
    common.save(args, "kv_quantization", {"model": args.model, "bits": args.bits, "probes": probes,
                                          "speed": sweep.to_dict("records")}, name="kv_quantization")


def restore(args, model) -> None:
    """A prefix restored from memory and disk against its prefill, and a warm chat turn against a cold one."""
    rows = measure_restore(model, LENGTHS, repeats=3)
    print(pd.DataFrame(rows), flush=True)
    turns = warm_vs_cold_ttft(model, LENGTHS, turn_tokens=64, repeats=3)
    print(pd.DataFrame(turns), flush=True)
    common.save(args, "prefix_cache", {"model": args.model, "bits": args.bits, "restore": rows,
                                       "warm_vs_cold": turns}, name="prefix_cache")


def main(argv=None) -> int:
    args = parse_args(argv)
    if "warmup" in args.parts:
        warmup(args)
    if "kv" in args.parts or "restore" in args.parts:
        model = common.load(args)
        if "kv" in args.parts:
            kv(args, model)
        if "restore" in args.parts:
            restore(args, model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
