"""KV-cache quantization (seed 000, notebook 02): decode and TTFT by context, the crossover,
memory and quality against the full-precision cache."""
from mlxlab.studies.base import Study

STUDY = Study("kv_quant", "KV-cache quantization", ("kv_quantization",), paper="4. KV-cache quantization (seed 000)",
              notebook="02_kv_quantization", decide="mlxlab.studies.kv_quant.run:decide_stored")
