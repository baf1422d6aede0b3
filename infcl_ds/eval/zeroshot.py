"""Zero-shot classification the OpenCLIP way: each class is the renormalised mean of its
normalised template embeddings, and an image is assigned the class of highest cosine."""
from typing import Callable, Dict, Iterable, Sequence, Union

import torch
import torch.nn.functional as F


def build_zero_shot_classifier(model, tokenizer, classnames: Sequence[str],
                               templates: Sequence[Union[str, Callable[[str], str]]], device) -> torch.Tensor:
    """[D, C] classifier weights: open_clip's own builder, so the numbers match OpenCLIP's."""
    from open_clip import build_zero_shot_classifier as open_clip_builder
    return open_clip_builder(model, tokenizer, classnames, templates, num_classes_per_batch=10, device=device)


def topk_accuracy(image_features: torch.Tensor, labels: torch.Tensor, classifier: torch.Tensor,
                  ks: Sequence[int] = (1, 5)) -> Dict[str, float]:
    """{"top1", "top5"}: the fraction of images whose label is among the k best classes
    (k capped at the number of classes)."""
    logits = image_features.float() @ classifier.float().to(image_features.device)
    best = logits.topk(min(max(ks), logits.shape[1]), dim=1).indices
    hit = best == labels.to(best.device).view(-1, 1)
    return {f"top{k}": hit[:, :k].any(dim=1).sum().item() / len(hit) for k in ks}


@torch.no_grad()
def encode_images(model, batches: Iterable, device) -> tuple:
    """(normalised image features, labels) over batches of (images, labels, ...), on the CPU."""
    features, labels = [], []
    for images, batch_labels, *_ in batches:
        features.append(F.normalize(model.encode_image(images.to(device)), dim=-1).float().cpu())
        labels.append(batch_labels.cpu())
    return torch.cat(features), torch.cat(labels)


def zero_shot_accuracy(model, classifier: torch.Tensor, batches: Iterable, device) -> Dict[str, float]:
    """{"top1", "top5"} of ``classifier`` (from ``build_zero_shot_classifier``) on batches of
    (normalised float images [n, 3, H, W], int labels [n], ...)."""
    features, labels = encode_images(model, batches, device)
    return topk_accuracy(features, labels, classifier.cpu())
