"""Image-text retrieval recall@k over index-matched (image i, caption i) pairs, as in
OpenCLIP's ``get_clip_metrics``, with two differences that matter for templated captions:

- captions with identical tokens are the same text, so each one is a correct match for every
  image that has it (else retrieving an exact duplicate of the true caption counts as a miss);
- a score tie between a correct and a wrong candidate counts against the query, so a
  collapsed model (all scores equal) gets recall 0, not an accident of sort order.

With distinct captions and no ties this is exactly OpenCLIP's recall.
"""
from typing import Dict, Iterable, Sequence

import torch
import torch.nn.functional as F

QUERY_BLOCK = 1024  # queries scored at a time: memory O(block x N), not O(N^2)


@torch.no_grad()
def encode_pairs(model, batches: Iterable, device) -> tuple:
    """(image features, text features, labels, text tokens) over batches of
    (images, labels, texts): features normalised, everything on the CPU."""
    images_f, texts_f, labels, tokens = [], [], [], []
    for images, batch_labels, texts in batches:
        images_f.append(F.normalize(model.encode_image(images.to(device)), dim=-1).float().cpu())
        texts_f.append(F.normalize(model.encode_text(texts.to(device)), dim=-1).float().cpu())
        labels.append(batch_labels.cpu())
        tokens.append(texts.cpu())
    return torch.cat(images_f), torch.cat(texts_f), torch.cat(labels), torch.cat(tokens)


def _recall(queries: torch.Tensor, candidates: torch.Tensor, caption_ids: torch.Tensor,
            ks: Sequence[int]) -> Dict[int, float]:
    """Per k, the fraction of queries i whose best correct candidate (same caption id as i)
    has fewer than k wrong candidates scoring at least as high."""
    hits = {k: 0 for k in ks}
    for lo in range(0, len(queries), QUERY_BLOCK):
        scores = queries[lo:lo + QUERY_BLOCK] @ candidates.T
        correct = caption_ids[lo:lo + QUERY_BLOCK, None] == caption_ids[None, :]
        best_correct = scores.masked_fill(~correct, float("-inf")).max(dim=1, keepdim=True).values
        wrong_ahead = ((scores >= best_correct) & ~correct).sum(dim=1)
        for k in ks:
            hits[k] += int((wrong_ahead < k).sum())
    return {k: hits[k] / len(queries) for k in ks}


def recall_at_k(image_features: torch.Tensor, text_features: torch.Tensor, texts: torch.Tensor,
                ks: Sequence[int] = (1, 5, 10)) -> Dict[str, float]:
    """{"image_to_text_R@k", "text_to_image_R@k"} from normalised features of index-matched
    pairs and the caption tokens (rows of ``texts``) that identify duplicate captions."""
    caption_ids = torch.unique(texts, dim=0, return_inverse=True)[1]
    out = {}
    for name, (queries, candidates) in {"image_to_text": (image_features, text_features),
                                        "text_to_image": (text_features, image_features)}.items():
        for k, value in _recall(queries.float(), candidates.float(), caption_ids, ks).items():
            out[f"{name}_R@{k}"] = value
    return out


def retrieval_recall(model, batches: Iterable, device, ks: Sequence[int] = (1, 5, 10)) -> Dict[str, float]:
    """Recall@k both ways over batches of (images, labels, texts), texts[i] captioning image i."""
    image_features, text_features, _, texts = encode_pairs(model, batches, device)
    return recall_at_k(image_features, text_features, texts, ks)
