"""ftscope: what an LLM fine-tuning run will cost, before you pay for it.

Public functions (each is what a CLI verb calls):

    ftscope.load_scenario(path_or_dict, overrides)  -> Scenario
    ftscope.estimate(scenario)                      -> Estimate   (memory, limits, time, run cost)
    ftscope.plan(scenario, gpus=..., max_gpus=...)  -> Plan       (one Estimate per GPU x count, ranked)

Nothing here imports torch: `estimate` and `plan` run on any laptop.
"""
from __future__ import annotations

# Bound eagerly: the functions share their names with the subpackages that hold them, and a lazy
# lookup would hand back the subpackage once it had been imported.
from .errors import FtscopeError  # noqa: E402
from .estimate import estimate  # noqa: E402
from .plan.search import plan  # noqa: E402
from .spec.scenario import load_scenario  # noqa: E402
from .version import __version__  # noqa: E402

__all__ = ["load_scenario", "estimate", "plan", "FtscopeError", "__version__"]
