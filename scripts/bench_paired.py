"""Add paired per-repeat ratios to a bench_engine.json written before bench.py reported them,
from the samples the file already holds (no new measurement). Usage: python scripts/bench_paired.py FILE"""
import json
import sys

from mlxlab.studies.bench import _ratio

path = sys.argv[1]
d = json.load(open(path))
for preset, res in d["presets"].items():
    s = res["samples"]
    for key, ours, ref in (("single_prefill_tok_s", "prefill_ours", "prefill_ref"),
                           ("single_decode_tok_s", "decode_ours", "decode_ref"),
                           ("batched_decode_tok_s", "batch_ours", "batch_ref")):
        res[key].update({k: v for k, v in _ratio(s[ours], s[ref]).items() if k.startswith("paired")})
        print(f"{preset:20s} {key:22s} ratio {res[key]['ratio']:.3f} paired {res[key]['paired_ratio_median']:.3f}")
json.dump(d, open(path, "w"), indent=2)
