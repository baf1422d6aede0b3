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


def test_the_gpu_decoder_rows_run_with_each_jpeg_library(tmp_path):
    """device_rows, on the CPU with each library's CPU decoder: a row per library, its pixels
    those of the PIL path's crops (the decoders and rounding differ, not the geometry)."""
    import pytest
    pytest.importorskip("nvidia.nvimgcodec", reason="the test extra installs nvImageCodec (setup.cfg)")
    from benchmarks.data import device_rows
    from encoded_shards import write_shard
    shard = write_shard(tmp_path / "shard-000000.tar")
    rows = [device_rows(shard, 16, 24, 8, "test", device="cpu", library=library)[0]
            for library in ("torchvision", "nvimgcodec")]
    assert [r["gpu_jpeg_library"] for r in rows] == ["torchvision", "nvimgcodec"]
    for row in rows:
        assert row["samples"] == 16 and row["samples_per_s"] > 0
        assert row["mean_abs_diff_vs_pil"] < 1.0 and row["max_abs_diff_vs_pil"] < 64
    assert rows[0]["mean_abs_diff_vs_pil"] == rows[1]["mean_abs_diff_vs_pil"]  # libjpeg-turbo both
