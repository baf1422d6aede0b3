"""The public losses: the functional API, its nn.Modules, and the OpenCLIP drop-ins.

    contrastive_loss / ContrastiveLoss   the CLIP (softmax) loss        losses/clip.py
    sigmoid_loss / SigmoidLoss           the SigLIP (sigmoid) loss      losses/siglip.py
    ClipLoss, SigLipLoss                 open_clip.loss's classes, same constructor and call,
                                         over the losses above          losses/openclip_dropins.py
"""
from .clip import ContrastiveLoss, contrastive_loss
from .openclip_dropins import ClipLoss, SigLipLoss
from .siglip import SigmoidLoss, sigmoid_loss

__all__ = ["ClipLoss", "ContrastiveLoss", "SigLipLoss", "SigmoidLoss", "contrastive_loss", "sigmoid_loss"]
