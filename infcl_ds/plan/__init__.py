"""The planner: memory per GPU and per node, step time and the binding limit of a recipe on
N GPUs, before anything is launched (`infcl-ds plan`, docs/planner.md)."""
from .refusal import PlanError
from .plan import Limit, Plan, make_plan
from .report import render_plan, render_scaling
from .timing import KernelRates, ring_scaling_table

__all__ = ["KernelRates", "Limit", "Plan", "PlanError", "make_plan", "render_plan", "render_scaling",
           "ring_scaling_table"]
