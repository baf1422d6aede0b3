"""`load_recipe`: a recipe file and its overrides -> a checked Recipe. Above both recipe.py (the
keys and their checks) and deepspeed_config.py (the DeepSpeed config built from a recipe), so
that neither imports the other back."""
from pathlib import Path
from typing import List, Optional, Union

from .deepspeed_config import check_deepspeed_config
from .recipe import Recipe, read_recipe


def load_recipe(path: Optional[Union[str, Path]] = None, overrides: Optional[List[str]] = None) -> Recipe:
    """Read a YAML recipe (or start from the defaults), apply ``section.key=value`` overrides,
    validate every key, the model name and the DeepSpeed settings; RecipeError otherwise."""
    recipe = read_recipe(path, overrides)
    check_deepspeed_config(recipe)
    return recipe
