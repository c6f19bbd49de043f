"""Overlap profile: which shared resource (the GIL or the device) the chat's gaps and the
document's TTFT grow on when a chat decodes beside a document prefilled on overlap mode's second
thread (issue 16). See :mod:`mlxlab.studies.contention.overlap_profile` for what is timed.

Usage::

    python -m probes.overlap_profile --models tiny --doc-tokens 1024 --chat-context 256   # CPU
    (H200: MLXLAB_PLATFORM=h200 with the mlx bundle on PYTHONPATH, 30k document, 1.5k chat)

Writes ``data/results/<platform>/overlap_profile.json``: per preset, per setting and GIL switch
interval, the chat's per-step milliseconds (graph / async_eval / token wait / host), the prefill
thread's host and device seconds alone and together, and the TTFT's growth split between them.
"""

from __future__ import annotations

import sys

from probes import common


def main(argv=None) -> int:
    p = common.parser(__doc__, "overlap_profile", model=None)
    p.add_argument("--models", nargs="+", default=["tiny"], help="presets (default: %(default)s)")
    p.add_argument("--bits", type=int, default=None, help="weight bits (default: the preset's dtype)")
    p.add_argument("--dtype", default=None, help="weight dtype (default: float32 on the CPU)")
    p.add_argument("--doc-tokens", type=int, default=1024, help="document tokens (default: %(default)s)")
    p.add_argument("--chat-context", type=int, default=256, help="chat prompt tokens (default: %(default)s)")
    p.add_argument("--settings", nargs="+", default=["overlap-2048", "overlap-2048-pipelined"],
                   help="overlap settings of mlxlab.studies.contention.run (default: %(default)s)")
    p.add_argument("--switch", nargs="+", default=["default", "0.0005"],
                   help="GIL switch intervals in seconds, or 'default' (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=3, help="runs of each (the first dropped) (default: %(default)s)")
    p.add_argument("--rescore", default=None, metavar="FILE",
                   help="recompute the TTFT growth split of a saved profile in place (no device)")
    args = common.parse(p, argv)
    from mlxlab.studies.contention.overlap_profile import overlap_profile, rescore

    if args.rescore:
        import json

        from mlxlab.core.results import dumps

        doc = rescore(json.loads(open(args.rescore).read()))
        open(args.rescore, "w").write(dumps(doc) + "\n")
        common.log("overlap_profile", f"rescored {args.rescore}")
        return 0

    intervals = [None if s == "default" else float(s) for s in args.switch]
    out = {}
    for name in args.models:
        common.log("overlap_profile", f"{name}: doc {args.doc_tokens}, chat {args.chat_context}")
        model = common.load(args, name)
        out[name] = overlap_profile(model, doc_tokens=args.doc_tokens, chat_context=args.chat_context,
                                    settings=args.settings, switch_intervals_s=intervals, repeats=args.repeats)
        del model
    common.save(args, "overlap_profile", {"bits": args.bits, "presets": out})
    return 0


if __name__ == "__main__":
    sys.exit(main())
