"""Zero-shot accuracy equals OpenCLIP's own zero-shot code (open_clip's legacy classifier
builder and open_clip_train's evaluation loop); retrieval recall equals a brute-force numpy
count, and OpenCLIP's get_clip_metrics when captions are distinct; a model whose features
are perfect scores 1.0 everywhere."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from infcl_ds.eval import build_zero_shot_classifier, evaluate, retrieval_recall, zero_shot_accuracy
from infcl_ds.eval.retrieval import recall_at_k
from infcl_ds.models import create_model, get_tokenizer, model_info

CLASSNAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
TEMPLATES = ["a photo of the number {}.", "a handwritten {}.", "the digit {}."]
N, BATCH = 37, 8  # a last batch shorter than the others


class FakeEvalData:
    """The interface of infcl_ds.data.build_eval_data's result: class names, templates and
    batches of (normalised images, int64 labels, int64 caption tokens)."""

    def __init__(self, images, labels, texts, classnames=CLASSNAMES, templates=TEMPLATES):
        self.images, self.labels, self.texts = images, labels, texts
        self.classnames, self.templates = classnames, templates

    def __iter__(self):
        for lo in range(0, len(self.labels), BATCH):
            yield self.images[lo:lo + BATCH], self.labels[lo:lo + BATCH], self.texts[lo:lo + BATCH]


@pytest.fixture(scope="module")
def tiny():
    model = create_model("infcl-tiny", seed=0).eval()
    tokenizer = get_tokenizer("infcl-tiny")
    size = model_info(model)["image_size"]
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, len(CLASSNAMES), (N,), generator=g)
    images = torch.randn(N, 3, size, size, generator=g)
    # Captions from a few templates: some are exact duplicates of others.
    texts = tokenizer([TEMPLATES[i % 2].format(CLASSNAMES[y]) for i, y in enumerate(labels.tolist())])
    return model, tokenizer, FakeEvalData(images, labels, texts)


def open_clip_train_accuracy(model, classifier, data):
    """open_clip_train.zero_shot.run's loop (the function itself fails under numpy 2: it
    calls float() on a 1-element array): the CLIP forward's image features, logits
    100 * f @ W, top-k counted per batch."""
    top1 = top5 = n = 0
    with torch.inference_mode():
        for images, labels, _ in data:
            image_features = model(image=images)[0]
            pred = (100.0 * image_features @ classifier).topk(5, 1, True, True)[1].t()
            correct = pred.eq(labels.view(1, -1).expand_as(pred))
            top1 += correct[:1].sum().item()
            top5 += correct[:5].sum().item()
            n += len(labels)
    return {"top1": top1 / n, "top5": top5 / n}


def test_zero_shot_matches_open_clip(tiny):
    import open_clip
    model, tokenizer, data = tiny
    classifier = build_zero_shot_classifier(model, tokenizer, CLASSNAMES, TEMPLATES, "cpu")
    legacy = open_clip.build_zero_shot_classifier_legacy(model, tokenizer, CLASSNAMES, TEMPLATES, device="cpu")
    torch.testing.assert_close(classifier, legacy, rtol=1e-5, atol=1e-6)

    ours = zero_shot_accuracy(model, classifier, data, "cpu")
    assert ours == pytest.approx(open_clip_train_accuracy(model, legacy, data), abs=1e-9)
    assert 0 < ours["top5"] < 1  # a meaningful comparison, not all right or all wrong


def numpy_recall(image_features, text_features, texts, ks):
    """Per query, walk the candidates best first; a hit at k means a candidate with the
    query's caption comes before k non-matching ones (ties go against the query)."""
    img, txt = image_features.double().numpy(), text_features.double().numpy()
    captions = [tuple(row) for row in texts.tolist()]
    out = {}
    for name, (queries, candidates) in {"image_to_text": (img, txt), "text_to_image": (txt, img)}.items():
        ranks = []
        for i, query in enumerate(queries):
            scores = candidates @ query
            match = [captions[j] == captions[i] for j in range(len(captions))]
            best = max(scores[j] for j in range(len(scores)) if match[j])
            ranks.append(sum(1 for j in range(len(scores)) if not match[j] and scores[j] >= best))
        for k in ks:
            out[f"{name}_R@{k}"] = float(np.mean(np.array(ranks) < k))
    return out


def test_retrieval_matches_numpy(tiny):
    model, _, data = tiny
    ours = retrieval_recall(model, data, "cpu", ks=(1, 5, 10))
    with torch.no_grad():
        image_features = F.normalize(model.encode_image(data.images), dim=-1)
        text_features = F.normalize(model.encode_text(data.texts), dim=-1)
    assert len(torch.unique(data.texts, dim=0)) < N  # duplicate captions are exercised
    assert ours == pytest.approx(numpy_recall(image_features, text_features, data.texts, (1, 5, 10)), abs=1e-9)


def test_distinct_captions_match_open_clip_get_clip_metrics():
    from open_clip_train.train import get_clip_metrics
    g = torch.Generator().manual_seed(1)
    image_features = F.normalize(torch.randn(50, 16, generator=g), dim=-1)
    text_features = F.normalize(image_features + 0.9 * torch.randn(50, 16, generator=g), dim=-1)
    texts = torch.arange(50).view(-1, 1)  # every caption distinct
    ours = recall_at_k(image_features, text_features, texts)
    theirs = get_clip_metrics(image_features, text_features, logit_scale=1.0)
    assert ours == pytest.approx({key: float(theirs[key]) for key in ours}, abs=1e-9)


def test_collapsed_features_score_zero():
    features = F.normalize(torch.ones(10, 4), dim=-1)
    assert set(recall_at_k(features, features, torch.arange(10).view(-1, 1), ks=(1, 5)).values()) == {0.0}


class PerfectModel(torch.nn.Module):
    """Features = a * onehot(class) + b * onehot(sample id), read off the inputs: image pixel
    [0, 0, 0] holds the class and [0, 0, 1] the id; token 0 holds class + 1, token 1 holds
    100 + id (captions) or 0 (class prompts)."""

    def __init__(self, classes, samples):
        super().__init__()
        self.classes, self.samples = classes, samples

    def _features(self, cls, ids):
        feats = torch.cat([F.one_hot(cls, self.classes).float(),
                           0.5 * F.one_hot(ids.clamp(min=0), self.samples).float() * (ids >= 0).view(-1, 1)], dim=1)
        return feats

    def encode_image(self, images, normalize=False):
        feats = self._features(images[:, 0, 0, 0].long(), images[:, 0, 0, 1].long())
        return F.normalize(feats, dim=-1) if normalize else feats

    def encode_text(self, texts, normalize=False):
        feats = self._features(texts[:, 0] - 1, texts[:, 1] - 100)
        return F.normalize(feats, dim=-1) if normalize else feats


def prompt_tokenizer(prompts):
    """Class prompts -> [class + 1, 0]: the class is the name's position in CLASSNAMES."""
    names = [next(i for i, name in enumerate(CLASSNAMES) if f" {name}." in f" {p}") for p in prompts]
    return torch.tensor([[i + 1, 0] for i in names])


def test_perfect_features_score_one():
    labels = torch.arange(N) % len(CLASSNAMES)
    images = torch.zeros(N, 3, 4, 4)
    images[:, 0, 0, 0], images[:, 0, 0, 1] = labels.float(), torch.arange(N).float()
    texts = torch.stack([labels + 1, 100 + torch.arange(N)], dim=1)
    model = PerfectModel(len(CLASSNAMES), N)
    metrics = evaluate(model, FakeEvalData(images, labels, texts), prompt_tokenizer, "cpu")
    assert set(metrics) == {"zeroshot_top1", "zeroshot_top5"} | {
        f"{d}_R@{k}" for d in ("image_to_text", "text_to_image") for k in (1, 5, 10)}
    assert all(value == 1.0 for value in metrics.values()), metrics


def test_evaluate_is_one_pass_of_both_and_restores_mode(tiny):
    model, tokenizer, data = tiny
    model.train()
    try:
        metrics = evaluate(model, data, tokenizer, "cpu")
        assert model.training
    finally:
        model.eval()
    classifier = build_zero_shot_classifier(model, tokenizer, CLASSNAMES, TEMPLATES, "cpu")
    zeroshot = zero_shot_accuracy(model, classifier, data, "cpu")
    expected = {f"zeroshot_{k}": v for k, v in zeroshot.items()} | retrieval_recall(model, data, "cpu")
    assert metrics == pytest.approx(expected, abs=1e-9)
