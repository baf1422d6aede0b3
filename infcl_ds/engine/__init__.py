"""DeepSpeed engine hook: chunked (GradCache) contrastive steps over ZeRO-sharded encoders."""
from .loss_adapter import ADAPTERS, LossAdapter
from .settings import EngineSettings
from .step import ContrastiveEngine

__all__ = ["ADAPTERS", "ContrastiveEngine", "EngineSettings", "LossAdapter"]
