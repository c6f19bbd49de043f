"""Draw paper/figures/speculative_pair_h200 from the large byte pair's results (issue 20 item 3):
measured decode speedup at k = 1..8 for each draft against the analytic model.

    python scripts/spec_pair_figure.py [data/results/h200/speculation_large_third.json ...]
"""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mlxlab.notebook.plots import save_figure  # noqa: E402
from mlxlab.studies.speculation.charts import pair_speedups_chart  # noqa: E402

DEFAULT = [ROOT / "data/results/h200" / f"speculation_large_{d}.json" for d in ("third", "tenth")]


def main(argv) -> int:
    files = [Path(a) for a in argv] or DEFAULT
    studies = {}
    for f in files:
        s = json.loads(f.read_text())
        studies[Path(s["models"]["draft"]).name] = s
    first = next(iter(studies.values()))
    m = first["models"]
    title = (f"{Path(m['target']).name} ({m['target_params'] / 1e6:.1f}M) on "
             f"{first['environment'].get('device_name') or 'this device'}: draft against k")
    for p in save_figure(pair_speedups_chart(studies, title), "speculative_pair_h200", ROOT / "paper" / "figures"):
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
