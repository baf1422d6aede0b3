"""EngineSettings (engine/settings.py): the engine's one typed settings object. Each field a
recipe key sets comes from that key through `from_recipe`, and defaults to that key's default
(stated once, in config/recipe.py); the rest are the engine's own."""
import dataclasses

import pytest

from infcl_ds.config import Recipe, load_recipe
from infcl_ds.engine import EngineSettings
from infcl_ds.engine.compile import COMPILE_BACKEND

# Settings, not kernels: nothing here differs on a GPU, but the file reads the engine's layer.
pytestmark = pytest.mark.gpu

# Each field a recipe key sets: the key, a value other than its default as --set writes it,
# and that value as the field holds it.
FROM_KEYS = {
    "chunk_size": ("batch.chunk", "8", 8),
    "loss": ("model.loss", "siglip", "siglip"),
    "offload_features": ("batch.offload_features", "true", True),
    "grad_accum_fp32": ("precision.grad_accum_fp32", "false", False),
    "float8": ("model.float8", "emulate", "emulate"),
    "gelu_epilogue": ("model.gelu_epilogue", "false", False),
}


def test_every_field_comes_from_its_recipe_key():
    base = EngineSettings.from_recipe(load_recipe(None, []), "cpu")
    for field, (key, text, value) in FROM_KEYS.items():
        settings = EngineSettings.from_recipe(load_recipe(None, [f"{key}={text}"]), "cpu")
        assert getattr(settings, field) == value != getattr(base, field), (field, key)
        assert dataclasses.replace(settings, **{field: getattr(base, field)}) == base, field  # that field alone


def test_compile_backend_is_model_compile_resolved_for_the_device():
    auto = load_recipe(None, [])  # model.compile: auto, ZeRO-2
    assert EngineSettings.from_recipe(auto, "cpu").compile_backend is None
    assert EngineSettings.from_recipe(auto, "cuda").compile_backend == COMPILE_BACKEND == "inductor"
    assert EngineSettings.from_recipe(load_recipe(None, ["zero.stage=3"]), "cuda").compile_backend is None
    assert EngineSettings.from_recipe(load_recipe(None, ["model.compile=true"]), "cpu").compile_backend == "inductor"
    assert EngineSettings.from_recipe(load_recipe(None, ["model.compile=false"]), "cuda").compile_backend is None


def test_the_defaults_are_the_recipe_s_and_the_engine_s_own():
    """An engine built without a recipe runs as the default recipe's, and the fields without a
    recipe key are the engine's debugging aid and the benchmarks' timings, off."""
    recipe = Recipe()
    assert EngineSettings(recipe.batch.chunk) == EngineSettings.from_recipe(recipe, "cpu")
    own = {f.name for f in dataclasses.fields(EngineSettings)} - set(FROM_KEYS) - {"compile_backend"}
    assert own == {"verify_replay", "time_phases"}
    settings = EngineSettings(4)
    assert not settings.verify_replay and not settings.time_phases and settings.compile_backend is None
    assert EngineSettings.from_recipe(recipe, "cpu", time_phases=True).time_phases is True


def test_settings_are_frozen_and_checked():
    settings = EngineSettings(4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.chunk_size = 8
    for bad in (0, -1, 2.0, True, "8"):
        with pytest.raises(ValueError, match="chunk_size must be an integer >= 1"):
            EngineSettings(bad)
    with pytest.raises(ValueError, match="batch.chunk is auto: resolve it"):
        EngineSettings.from_recipe(load_recipe(None, ["batch.chunk=auto"]), "cpu")
