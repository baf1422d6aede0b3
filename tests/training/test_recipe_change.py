"""training/recipe_change.py's decoder notice: `data.decoder: auto` (the default) resolves per
node, and a run resumes on any node, so a resume may decode with another decoder than the
checkpoint's run. Not a trajectory change (the same rows in the same order), but said."""
from infcl_ds.config import dump_recipe, load_recipe
from infcl_ds.training.recipe_change import decoder_change, trajectory_changes


def saved_with(decoder):
    """A saved recipe's YAML with data.decoder `decoder`, or without the key (an older checkpoint)."""
    text = dump_recipe(load_recipe(None, [f"data.decoder={decoder or 'pil'}"]))
    return text if decoder else "\n".join(line for line in text.splitlines() if "decoder: pil" not in line)


def test_a_resume_that_decodes_with_another_decoder_is_said_not_refused():
    hybrid = dump_recipe(load_recipe(None, ["data.decoder=hybrid"]))
    assert decoder_change(saved_with("pil"), hybrid) == "pil -> hybrid"
    assert trajectory_changes(saved_with("pil"), hybrid) == []
    assert decoder_change(saved_with("hybrid"), hybrid) is None
    # a checkpoint from before `auto` was the default ran with pil
    assert "decoder:" not in saved_with(None)
    assert decoder_change(saved_with(None), hybrid) == "pil -> hybrid"
    assert decoder_change(saved_with(None), dump_recipe(load_recipe(None, ["data.decoder=pil"]))) is None
