"""The engine-bench study's verdicts decided from a stored file (``mlxlab rescore``): a module of
its own because they read both the bench's rules (:mod:`~mlxlab.studies.engine_bench.run`) and the
decode limit's (:mod:`~mlxlab.studies.engine_bench.decode_limit`), which imports the bench."""

from __future__ import annotations

from typing import Dict, List

from mlxlab.studies.engine_bench.decode_limit import decode_verdicts
from mlxlab.studies.engine_bench.run import SPEED_METRICS, verdicts


def decide_stored(doc: Dict, path=None) -> List[Dict]:
    """The verdicts of a saved ``bench_engine.json`` (``mlxlab bench engine``: :func:`verdicts` of
    its presets, and the decode-limit verdict when it measured the limit) or ``overview_bench.json``
    (notebook 00: one model's :func:`bench_engine` result and its exactness check), from stored
    data only (:class:`~mlxlab.studies.base.Study`'s ``decide``); told apart by their keys."""
    if "presets" in doc:
        presets = doc["presets"]
        limits = {p: r["decode_limit"] for p, r in presets.items() if "decode_limit" in r}
        return verdicts(presets) + (decode_verdicts(limits) if limits else [])
    needs = ("model", "dtype", "exactness", "config", "greedy_tokens_agree", *(k for k, _ in SPEED_METRICS.values()))
    missing = [k for k in needs if k not in doc]
    if missing:
        raise ValueError(f"{path or 'this document'} is not an engine-bench result (no presets, nor "
                         f"{', '.join(missing)}): rescore a bench_engine.json or overview_bench.json")
    # the notebook stored bench_engine's result at the top level, the model's dtype beside it
    return verdicts({doc["model"]: {**doc, "model": {"dtype": doc["dtype"]}}}, doc["exactness"])
