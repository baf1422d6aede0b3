"""DeepSpeed engine hook: chunked (GradCache) contrastive steps over ZeRO-sharded encoders."""
from .step import ContrastiveEngine

__all__ = ["ContrastiveEngine"]
