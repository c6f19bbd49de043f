"""probes/decode_apart_probe.py: its scene puts documents in their own forward only with
``decode_apart``, and times the chat's gaps from the first document's arrival to its last token."""

import argparse
import random

from probes.decode_apart_probe import scene, summary


def test_the_probe_scene_keeps_documents_apart_only_with_decode_apart_and_times_every_chat_gap(tiny):
    args = argparse.Namespace(policy="interleave", chunk_size=64, chat_tokens=24, doc_tokens=200, doc_max_tokens=4)
    prompt = list(range(3, 40))
    joined = scene(tiny, args, None, prompt, random.Random(1))
    apart = scene(tiny, args, 16, prompt, random.Random(1))
    alone = scene(tiny, args, 16, prompt, random.Random(1), docs=False)
    assert joined["rows_apart"] == 0 and apart["rows_apart"] >= 1 and alone["rows_apart"] == 0
    assert apart["docs_finished"] >= 1 and alone["docs_finished"] == 0
    assert all(len(run["gaps_ms"]) == args.chat_tokens for run in (joined, apart, alone))
    s = summary(joined["gaps_ms"])
    assert s["n_gaps"] == args.chat_tokens and s["itl_p50_ms"] <= s["itl_p99_ms"] <= s["itl_max_ms"]
