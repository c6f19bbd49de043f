"""Does speculative decoding reproduce the target's greedy output, per dtype, on this machine?

On the H200 the large byte pair's speculative outputs (ours and mlx-lm's) left the target's
greedy output for every draft length, while on the CPU (float32) they are identical. This runs
:func:`mlxlab.studies.speculation.exactness.greedy_exactness` on a trained pair in bfloat16 (the GPU
default), float16 and float32 and stores the counts with provenance:

    python scripts/spec_exactness.py --target data/weights/byte-draft-third \
        --draft data/weights/byte-draft-tenth --corpus build/corpus.tar.xz [--save]

On the H200: the same after `bash scripts/h200.sh --version` has unpacked the bundle, with
PYTHONPATH=.mlxcuda/site:. (scripts/h200.sh's environment).
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mlxlab.core.results import run_folder, save_results  # noqa: E402
from mlxlab.engine.models import load_model  # noqa: E402
from mlxlab.studies.speculation.exactness import greedy_exactness  # noqa: E402
from mlxlab.train.corpus import heldout_prompts, load_pack  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--corpus", required=True, metavar="PACK")
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16", "float16", "float32"])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--platform", default=None)
    ap.add_argument("--save", action="store_true", help="write the committed results folder")
    args = ap.parse_args()
    held = load_pack(args.corpus)["heldout"]
    prompts = heldout_prompts(args.prompts, length=96, seed=1, data=held, midline=True)
    runs = {}
    for dt in args.dtypes:
        target, draft = load_model(args.target, dtype=dt), load_model(args.draft, dtype=dt)
        r = greedy_exactness(target, draft, prompts, k=args.k, max_tokens=args.max_tokens)
        runs[dt] = r
        m = sorted(r["margins_at_flips"])
        print(f"{dt:9s} ours identical {r['ours_identical']}/{r['num_prompts']}, mlx-lm "
              f"{r['mlx_lm_identical']}/{r['num_prompts']}; teacher-forced argmax flips "
              f"{r['flip_positions']}/{r['positions']} (margins {m[:5]}), max |dlogit| "
              f"{r['max_abs_logit_diff']:.3g}", flush=True)
    payload = {"target": args.target, "draft": args.draft, "runs": runs}
    path = save_results("speculation_exactness", payload, platform=args.platform,
                        folder=run_folder(args.platform, args.save), parameters=vars(args))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
