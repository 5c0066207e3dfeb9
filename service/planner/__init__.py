"""The pre-flight planner: memory per rank, layouts, step time and findings of a job spec.

Pure Python: it sizes models with the torch-free ``workers.models.config``, so
the control plane plans without importing torch.

- :mod:`.planning`: ``plan_job``, what submit and ``POST /v1/plan`` run;
  :mod:`.plan`: the typed :class:`Plan` it answers with.
- :mod:`.memory_model`, :mod:`.step_time`: bytes per rank and seconds per step of a layout;
  :mod:`.layout_rules`: candidate layouts, the recommendation and the findings;
  :mod:`.hardware`: known GPUs and links, and the cluster a plan is made for.
"""

from service.planner.plan import Plan
from service.planner.planning import ClusterSpec, plan_job

__all__ = ["ClusterSpec", "Plan", "plan_job"]
