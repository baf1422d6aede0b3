"""Former home of the CLIP loss, kept for ``from infcl_ds.loss import contrastive_loss``
(benchmarks/train.py among others); the losses live in infcl_ds/losses/."""
from .losses.clip import ContrastiveLoss, contrastive_loss  # noqa: F401
