"""The shipped tiny configs are open_clip models: registered once, created from scratch with
a reproducible seed, and described by model_info for the data pipeline."""
import json
import logging

import open_clip
import pytest
import torch

from infcl_ds.models import (CONFIG_DIR, create_model, get_tokenizer, meta_model, model_info, register_tiny_configs,
                             state_dict_shapes)

TINY_NAMES = ["infcl-tiny", "infcl-tiny-digits"]


def test_register_is_idempotent():
    register_tiny_configs()
    paths = list(open_clip.factory._MODEL_CONFIG_PATHS)
    register_tiny_configs()
    assert open_clip.factory._MODEL_CONFIG_PATHS == paths
    assert set(TINY_NAMES) <= set(open_clip.list_models())


@pytest.mark.parametrize("name", TINY_NAMES)
def test_tiny_model_matches_its_config(name):
    cfg = json.loads((CONFIG_DIR / f"{name}.json").read_text())
    model = create_model(name, seed=0)
    info = model_info(model)
    assert info["image_size"] == cfg["vision_cfg"]["image_size"]
    assert info["context_length"] == cfg["text_cfg"]["context_length"]
    assert info["embed_dim"] == cfg["embed_dim"]
    assert info["mean"] == open_clip.OPENAI_DATASET_MEAN and info["std"] == open_clip.OPENAI_DATASET_STD
    tokens = get_tokenizer(name)(["a handwritten seven", "the digit 7"])
    assert tokens.shape == (2, info["context_length"]) and tokens.dtype == torch.int64
    size = info["image_size"]
    with torch.no_grad():
        image_features = model.encode_image(torch.randn(2, 3, size, size))
        text_features = model.encode_text(tokens)
    assert image_features.shape == text_features.shape == (2, info["embed_dim"])


def test_seed_is_reproducible_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    a = create_model("infcl-tiny", seed=7)
    assert torch.equal(torch.rand(1), expected_next)
    b = create_model("infcl-tiny", seed=7)
    c = create_model("infcl-tiny", seed=8)
    for (key, va), vb, vc in zip(a.state_dict().items(), b.state_dict().values(), c.state_dict().values()):
        assert torch.equal(va, vb), key
    assert not torch.equal(a.visual.conv1.weight, c.visual.conv1.weight)


def test_state_dict_shapes_match_a_real_model():
    model = create_model("infcl-tiny")
    assert state_dict_shapes("infcl-tiny") == {k: v.shape for k, v in model.state_dict().items()}
    assert state_dict_shapes("infcl-tiny")["logit_scale"] == torch.Size([])


@pytest.mark.parametrize("build", [lambda: create_model("infcl-tiny"), lambda: meta_model("infcl-tiny")])
def test_no_initialized_randomly_warning(build, caplog):
    # Eval and export load a checkpoint into the model right after: open_clip's warning that no
    # pretrained weights were loaded would say the checkpoint was not used.
    filters = list(logging.root.filters)
    with caplog.at_level(logging.INFO):
        build()
        logging.warning("another warning still shows")
    messages = [record.getMessage() for record in caplog.records]
    assert not [m for m in messages if "initialized randomly" in m], messages
    assert "another warning still shows" in messages
    assert logging.root.filters == filters  # only while the model is built
