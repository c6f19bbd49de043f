"""summarize() is a table a notebook displays well: one row per tenant, flat numeric columns."""

import math

import pandas as pd

from mlxlab.core.metrics import summarize, tenant_summaries
from mlxlab.core.request import Request


def _req(i, tenant, times, arrival=0.0):
    r = Request(id=i, prompt=[1, 2, 3], max_tokens=len(times), tenant=tenant, arrival_s=arrival)
    r.token_times_s = list(times)
    r.output_tokens = [5] * len(times)
    r.finish_s = times[-1]
    return r


def test_summarize_is_a_dataframe_by_tenant_with_the_nested_figures():
    reqs = [_req(0, "chat", [0.1, 0.2, 0.4]), _req(1, "chat", [0.3, 0.35]), _req(2, "batch", [1.0, 1.5], 0.5)]
    table = summarize(reqs)
    nested = tenant_summaries(reqs)
    assert isinstance(table, pd.DataFrame) and list(table.index) == ["all", "chat", "batch"]
    assert table.loc["chat", "requests"] == 2
    assert math.isclose(table.loc["chat", "ttft_p50_s"], nested["chat"]["ttft_s"]["p50"])
    assert math.isclose(table.loc["batch", "itl_p99_s"], 0.5) and math.isclose(table.loc["all", "itl_max_s"], 0.5)
    assert all(pd.api.types.is_numeric_dtype(table[c]) for c in table.columns)
    assert "\n" in repr(table) and "{" not in repr(table)  # rows and numbers, no nested dicts
