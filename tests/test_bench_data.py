"""benchmarks/data.py: what each shipped recipe needs from its decoders is the planner's count."""
from pathlib import Path

from benchmarks.data import needed_rows
from infcl_ds.config import load_recipe

RECIPES = Path(__file__).resolve().parents[1] / "ds_configs" / "recipes"


def test_needed_decodes_are_the_planners_and_count_kept_rows_once():
    rows = {r["recipe"]: r for r in needed_rows(170.0, RECIPES)}
    assert rows and all("cpu" not in name for name in rows)
    # ViT-B-32 at 512k on one GPU keeps the whole local batch decoded (data.keep_decoded_gib: 74):
    # one decode a sample a step, not one per pass.
    b32 = rows["vit-b32-512k-1gpu.yaml"]
    local = load_recipe(RECIPES / "vit-b32-512k-1gpu.yaml").local_batch(1)
    assert b32["local_batch"] == local
    assert abs(b32["decodes_per_s_per_rank"] - local / b32["plan_step_s"]) < 1e-6 * local
    assert b32["workers_per_rank"] == b32["decodes_per_s_per_rank"] / 170.0
