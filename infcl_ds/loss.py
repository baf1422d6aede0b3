"""Deprecated: the former home of the CLIP loss, kept for ``from infcl_ds.loss import
contrastive_loss`` (benchmarks/train.py among others). Import from ``infcl_ds`` (or
``infcl_ds.losses``), where the losses live; this module adds nothing and warns about nothing."""
from .losses.clip import ContrastiveLoss, contrastive_loss  # noqa: F401
