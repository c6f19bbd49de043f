"""Contention (``mlxlab bench contention``): a chat decoding beside a document's prefill under
each setting, the frontier of chat ITL against document TTFT; ``sweep`` spreads it over a
cluster, ``overlap_profile`` says which shared resource the gaps grow on."""
from mlxlab.studies.base import Study

STUDY = Study("contention", "Contention frontier", ("contention",),
              paper="7. The stall, the admission gate and the chunk-size trade-off (seed 001)",
              command="mlxlab bench contention", decide="mlxlab.studies.contention.verdict:decide_stored",
              charts="mlxlab.studies.contention.charts:frontier_chart_of")
