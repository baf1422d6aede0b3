"""Recipes (YAML, validated) and the DeepSpeed configs built from them."""
from .deepspeed_config import build_deepspeed_config
from .load import load_recipe
from .recipe import Recipe, RecipeError, check_world, dump_recipe

__all__ = ["Recipe", "RecipeError", "build_deepspeed_config", "check_world", "dump_recipe", "load_recipe"]
