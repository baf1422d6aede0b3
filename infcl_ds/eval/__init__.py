"""Evaluation of a CLIP model the OpenCLIP way: zero-shot classification and image-text
retrieval, from one pass over an eval set."""
from typing import Dict

from .retrieval import encode_pairs, recall_at_k, retrieval_recall
from .zeroshot import build_zero_shot_classifier, topk_accuracy, zero_shot_accuracy


def evaluate(model, eval_data, tokenizer, device) -> Dict[str, float]:
    """{"zeroshot_top1", "zeroshot_top5", "image_to_text_R@k", "text_to_image_R@k"} (k = 1, 5, 10).

    ``eval_data`` has ``.classnames``, ``.templates`` and iterates over batches of
    (normalised float images, int64 labels, int64 caption tokens). The model is put in eval
    mode for the pass and given back in the mode it came in.
    """
    was_training = model.training
    model.eval()
    try:
        classifier = build_zero_shot_classifier(model, tokenizer, eval_data.classnames, eval_data.templates, device)
        image_features, text_features, labels, texts = encode_pairs(model, eval_data, device)
    finally:
        model.train(was_training)
    zeroshot = topk_accuracy(image_features, labels, classifier.cpu())
    metrics = {f"zeroshot_{name}": value for name, value in zeroshot.items()}
    metrics.update(recall_at_k(image_features, text_features, texts))
    return metrics


__all__ = ["build_zero_shot_classifier", "evaluate", "retrieval_recall", "zero_shot_accuracy"]


def metric_label(metric: str) -> str:
    """The printed name of a metric: zeroshot_top1 -> zero-shot top-1, image_to_text_R@5 -> image->text R@5."""
    if metric.startswith("zeroshot_top"):
        return "zero-shot top-" + metric[len("zeroshot_top"):]
    return metric.replace("_to_", "->").replace("_R@", " R@")
