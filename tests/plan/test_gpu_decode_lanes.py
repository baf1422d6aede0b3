"""data.gpu_decode_lanes in the planner: one lane's measured rate and slowdown times the measured
ratios of N lanes over one (footprint.gpu_decode_rate, gpu_decode_towers_slowdown), the hybrid
share and the decode line following them, and `calibrate --decode-lanes` writing the ratios from
the lanes-N rows of benchmarks/decode.py's variants."""
import json
import shutil

import pytest
from pydantic import ValidationError

from infcl_ds.config import Recipe
from infcl_ds.data import footprint
from infcl_ds.plan import calibrate


def data_section(**data):
    return Recipe.model_validate({"data": {"source": "webdataset", "train": "x", **data}}).data


@pytest.fixture
def rates(monkeypatch):
    for key, value in {"nvjpeg_per_gpu": 1000.0, "nvjpeg_towers_slowdown": 1.1,
                       "nvjpeg_lanes_gain": {"2": 1.5, "4": 2.5}, "nvjpeg_lanes_slowdown": {"2": 1.2, "4": 1.3},
                       "nvjpeg_lanes_per_gpu": {"2": 1600.0, "4": 3000.0},
                       "pil_per_process": 100.0}.items():
        monkeypatch.setitem(footprint._DECODE_RATES, key, value)
    monkeypatch.setitem(footprint.DECODE_RATES_PER_WORKER, "pil", 100.0)


def test_a_lane_count_takes_the_largest_measured_count_up_to_it(rates):
    assert footprint.gpu_decode_rate("torchvision") == footprint.gpu_decode_rate("torchvision", 1) == 1000.0
    assert footprint.gpu_decode_rate("torchvision", 2) == 1500.0
    assert footprint.gpu_decode_rate("torchvision", 3) == 1500.0  # 3 not measured: what 2 gave
    assert footprint.gpu_decode_rate("torchvision", 16) == 2500.0
    assert footprint.gpu_decode_towers_slowdown("torchvision", 4) == pytest.approx(1.1 * 1.3)
    assert footprint.gpu_decode_towers_slowdown("torchvision", 1) == 1.1


def test_a_gain_never_lifts_the_rate_past_what_that_many_lanes_decoded(rates, monkeypatch):
    # one lane's rate from a faster run than the lanes' own: 2 lanes measured 1,600/s
    monkeypatch.setitem(footprint._DECODE_RATES, "nvjpeg_per_gpu", 1200.0)
    assert footprint.gpu_decode_rate("torchvision", 2) == 1600.0  # not 1,800
    assert footprint.gpu_decode_rate("torchvision", 4) == 3000.0
    # nor takes it below one lane's
    monkeypatch.setitem(footprint._DECODE_RATES, "nvjpeg_per_gpu", 2000.0)
    assert footprint.gpu_decode_rate("torchvision", 2) == 2000.0


def test_without_measured_lanes_more_lanes_are_planned_as_one(rates, monkeypatch):
    monkeypatch.delitem(footprint._DECODE_RATES, "nvjpeg_lanes_gain")
    monkeypatch.delitem(footprint._DECODE_RATES, "nvjpeg_lanes_slowdown")
    assert footprint.gpu_decode_rate("torchvision", 4) == 1000.0
    assert footprint.gpu_decode_towers_slowdown("torchvision", 4) == 1.1


def test_the_hybrid_share_follows_the_lanes_rate(rates):
    one = data_section(decoder="hybrid", decode_workers=10)
    four = data_section(decoder="hybrid", decode_workers=10, gpu_decode_lanes=4)
    assert footprint.hybrid_gpu_share(one) == pytest.approx(1000 / 2000)
    assert footprint.hybrid_gpu_share(four) == pytest.approx(2500 / 3500)
    assert footprint.gpu_decode_share(four) == pytest.approx(2500 / 3500)
    assert footprint.hybrid_gpu_share(four.model_copy(update={"decode_workers": 0})) == 1.0


@pytest.mark.parametrize("lanes", [0, 17, "two", 1.5])
def test_a_lane_count_outside_1_to_16_is_refused_naming_the_key(lanes):
    with pytest.raises(ValidationError, match="gpu_decode_lanes"):
        data_section(gpu_decode_lanes=lanes)


def variants_json(tmp_path, rows_by_lanes):
    rows = [{"kind": "decoder", "variant": f"lanes-{n}", "shards": "photos", "gpu_jpeg_library": "torchvision",
             "backend": "nvjpeg", "beside_training": True, "images_per_s": rate, "towers_slowdown": slowdown,
             "towers_model": "ViT-B-16", "commit": "abc", "device": "H200"}
            for n, (rate, slowdown) in rows_by_lanes.items()]
    rows += [{**rows[-1], "variant": "lanes-4-compiled", "images_per_s": 1.0},  # a variant of a count: not it
             {**rows[-1], "shards": "large", "images_per_s": 2.0},
             {**rows[-1], "beside_training": False, "images_per_s": 3.0}]
    path = tmp_path / "decode_variants.json"
    path.write_text(json.dumps({"meta": {}, "rows": rows}))
    return path


def test_calibrate_writes_each_counts_ratios_to_one_lane_of_the_same_run(tmp_path):
    out = tmp_path / "calibration"
    shutil.copytree(calibrate.CALIBRATION, out)
    before = json.loads((out / "decode_rates.json").read_text())
    path = variants_json(tmp_path, {1: (3000.0, 1.05), 2: (4500.0, 1.26), 4: (7500.0, 0.9), 8: (2000.0, 1.5)})
    assert calibrate.main(["--decode-lanes", str(path), "--out", str(out)]) == 0
    after = json.loads((out / "decode_rates.json").read_text())
    assert after["nvjpeg_lanes_gain"] == {"2": 1.5, "4": 2.5, "8": 1.0}  # slower than one lane: planned as one
    assert after["nvjpeg_lanes_per_gpu"] == {"2": 4500.0, "4": 7500.0, "8": 2000.0}
    assert after["nvjpeg_lanes_slowdown"] == {"2": 1.2, "4": 1.0, "8": pytest.approx(1.429, abs=1e-3)}
    assert "commit abc" in after["nvjpeg_lanes_source"] and "4 lanes 7,500/s" in after["nvjpeg_lanes_source"]
    assert {k: v for k, v in after.items() if not k.startswith("nvjpeg_lanes")} == \
        {k: v for k, v in before.items() if not k.startswith("nvjpeg_lanes")}
    # one lane alone, or no lanes-1 row: nothing to divide by, nothing written
    assert calibrate.main(["--decode-lanes", str(variants_json(tmp_path, {1: (3000.0, 1.0)})),
                           "--out", str(out)]) == 2
    assert calibrate.main(["--decode-lanes", str(variants_json(tmp_path, {2: (3000.0, 1.0), 4: (1.0, 1.0)})),
                           "--out", str(out)]) == 2
