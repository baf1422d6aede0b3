"""DeepSpeed engine hook: chunked (GradCache) contrastive steps over ZeRO-sharded encoders."""
from .loss_adapter import ADAPTERS, LossAdapter
from .step import ContrastiveEngine

__all__ = ["ADAPTERS", "ContrastiveEngine", "LossAdapter"]
