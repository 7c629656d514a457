"""ftscope: what an LLM fine-tuning run will cost, before you pay for it.

Public functions (each is what a CLI verb calls):

    ftscope.load_scenario(path_or_dict, overrides)  -> Scenario
    ftscope.estimate(scenario)                      -> Estimate   (memory, limits, time, run cost)
    ftscope.plan(scenario, gpus=..., max_gpus=...)  -> Plan       (one Estimate per GPU x count, ranked)
    ftscope.recommend(scenario, gpus=..., top=10)   -> Recommendation (best mixes, counts per reason, why)

Nothing here imports torch: `estimate` and `plan` run on any laptop.
"""
from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

# Bound eagerly: the functions share their names with the subpackages that hold them, and a lazy
# lookup would hand back the subpackage once it had been imported.
from .errors import FtscopeError  # noqa: E402
from .estimate import estimate  # noqa: E402
from .plan.recommend import recommend  # noqa: E402
from .plan.search import plan  # noqa: E402
from .spec.scenario import Scenario  # noqa: E402
from .version import __version__  # noqa: E402


def load_scenario(source: str | os.PathLike[str] | Mapping[str, Any], overrides: Sequence[str] = ()) -> Scenario:
    """A checked Scenario from a scenario YAML/JSON path, a mapping, or a fine-tuning framework's own config
    (Axolotl, LLaMA-Factory, torchtune, TRL: see spec/frameworks), with `key.path=value` overrides applied."""
    from .spec.frameworks import load
    from .spec.scenario import load_scenario as load_mapping

    if isinstance(source, (str, os.PathLike)):
        return load(source, overrides)[0]
    return load_mapping(source, overrides)


__all__ = ["load_scenario", "estimate", "plan", "recommend", "FtscopeError", "__version__"]
