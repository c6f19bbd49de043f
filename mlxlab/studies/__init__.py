"""The experiments, one package each, mirroring the notebooks (and the CLI studies with none).

Every package declares a :class:`~mlxlab.studies.base.Study` in its ``__init__.py`` (plain data:
declaring one imports no MLX); :func:`all_studies` lists them in notebook order and
:func:`study_for` finds the study a results file belongs to, which is how ``mlxlab rescore``
rescores any saved result the same way. Shared here: :mod:`~mlxlab.studies.base` (the protocol),
:mod:`~mlxlab.studies.rules` (what verdict rules share) and :mod:`~mlxlab.studies.fresh_process`
(the child process of the cold-start measurements of notebooks 01 and 04).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, List, Union

if TYPE_CHECKING:
    from mlxlab.studies.base import Study

#: the study packages, in the order of the notebooks, then the CLI-only studies
PACKAGES = ("engine_bench", "prefill_step", "kv_quant", "speculation", "warmup", "admission_gate", "prefix_cache",
            "roofline", "seed_scale", "disagg", "scheduling", "contention", "sim_validation", "serving", "tune")


def all_studies() -> List["Study"]:
    """Every study's declaration, in :data:`PACKAGES` order."""
    return [importlib.import_module(f"{__name__}.{p}").STUDY for p in PACKAGES]


def study_for(path: Union[str, Path]) -> "Study":
    """The study a results file belongs to, by its name (the longest results name that matches:
    ``scheduling_slo.json`` is the scheduling study's); ValueError naming the known ones if none."""
    from mlxlab.studies.base import belongs, results_name

    stem = results_name(path)
    found = [(len(r), s) for s in all_studies() for r in s.results if belongs(stem, r)]
    if not found:
        known = sorted(r for s in all_studies() for r in s.results)
        raise ValueError(f"{path}: no study writes results named {stem!r}; the studies write {', '.join(known)}")
    return max(found, key=lambda x: x[0])[1]
