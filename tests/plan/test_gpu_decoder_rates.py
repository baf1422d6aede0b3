"""The GPU decoder in the planner: its rate per data.gpu_jpeg_library, the towers slowed while it
decodes (plan/timing.py beside_gpu_decoder), and `calibrate --decode` writing both from
benchmarks/decode.py's rows, the other rates kept."""
import json
import shutil

import pytest

from infcl_ds.config import Recipe
from infcl_ds.data import footprint
from infcl_ds.plan import calibrate
from infcl_ds.plan.timing import beside_gpu_decoder

CALIBRATION = calibrate.CALIBRATION


def decode_json(tmp_path, rate, slowdown, commit="abc"):
    rows = [{"kind": "decoder", "shards": "photos", "gpu_jpeg_library": "nvimgcodec", "backend": backend,
             "beside_training": True, "images_per_s": value, "towers_slowdown": slowdown, "bytes_per_image": 30557,
             "images": 8192, "piece": 1024, "towers_model": "ViT-B-16", "commit": commit, "device": "H100"}
            for backend, value in (("hardware", 99999.0), ("trainer's", rate))]
    rows.append({**rows[-1], "shards": "large", "images_per_s": 1.0})
    rows.append({**rows[-1], "shards": "photos", "beside_training": False, "images_per_s": 2.0})
    path = tmp_path / "decode.json"
    path.write_text(json.dumps({"meta": {}, "rows": rows}))
    return path


def test_calibrate_writes_the_trainers_decoder_beside_training_and_keeps_the_rest(tmp_path):
    out = tmp_path / "calibration"
    shutil.copytree(CALIBRATION, out)
    before = json.loads((out / "decode_rates.json").read_text())
    assert calibrate.main(["--decode", str(decode_json(tmp_path, 12345.6, 1.0421)), "--out", str(out)]) == 0
    after = json.loads((out / "decode_rates.json").read_text())
    assert after["nvimgcodec_per_gpu"] == 12345.6 and after["nvimgcodec_towers_slowdown"] == 1.0421
    assert "commit abc" in after["nvimgcodec_source"] and "x1.042" in after["nvimgcodec_source"]
    assert {k: v for k, v in after.items() if not k.startswith("nvimgcodec")} == \
        {k: v for k, v in before.items() if not k.startswith("nvimgcodec")}
    # no row of the trainer's decoder beside training: nothing written, said by the exit status
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"meta": {}, "rows": []}))
    assert calibrate.main(["--decode", str(empty), "--out", str(out)]) == 2


def test_the_towers_slow_by_the_measured_factor_over_the_share_of_time_the_decoder_is_busy(monkeypatch):
    data = Recipe.model_validate({"data": {"source": "webdataset", "train": "x", "decoder": "nvjpeg",
                                           "gpu_jpeg_library": "nvimgcodec"}}).data
    monkeypatch.delitem(footprint._DECODE_RATES, "nvimgcodec_towers_slowdown", raising=False)
    assert beside_gpu_decoder(data, 1000, 3.0, 7.0, "src") == (3.0, 7.0, "src")  # not measured: x1
    monkeypatch.setitem(footprint._DECODE_RATES, "nvimgcodec_towers_slowdown", 1.1)
    monkeypatch.setitem(footprint._DECODE_RATES, "nvimgcodec_per_gpu", 200.0)
    # 1,000 rows at 200/s keep the decoder busy 5 s of the towers' 10: x1.05
    encode, reencode, source = beside_gpu_decoder(data, 1000, 3.0, 7.0, "src")
    assert (encode, reencode) == (pytest.approx(3.15), pytest.approx(7.35))
    assert source == "src; x1.050 beside the GPU decoder (x1.1 while it decodes, 50% of the time)"
    # torchvision's decoder has its own slowdown (here: unmeasured); the PIL processes slow nothing here
    monkeypatch.delitem(footprint._DECODE_RATES, "nvjpeg_towers_slowdown", raising=False)
    tv = data.model_copy(update={"gpu_jpeg_library": "torchvision"})
    assert beside_gpu_decoder(tv, 1000, 3.0, 7.0, "src")[:2] == (3.0, 7.0)
    assert beside_gpu_decoder(data.model_copy(update={"decoder": "pil"}), 1000, 3.0, 7.0, "src")[:2] == (3.0, 7.0)
    assert footprint.gpu_decode_rate("nvimgcodec") == 200.0 and footprint.gpu_decode_rate("torchvision") == footprint._DECODE_RATES["nvjpeg_per_gpu"]


def test_a_new_rate_never_keeps_an_older_runs_slowdown_and_noise_below_one_is_one(tmp_path):
    out = tmp_path / "calibration"
    shutil.copytree(CALIBRATION, out)
    assert calibrate.main(["--decode", str(decode_json(tmp_path, 9000.0, 0.97)), "--out", str(out)]) == 0
    assert json.loads((out / "decode_rates.json").read_text())["nvimgcodec_towers_slowdown"] == 1.0
    assert calibrate.main(["--decode", str(decode_json(tmp_path, 9500.0, None)), "--out", str(out)]) == 0
    rates = json.loads((out / "decode_rates.json").read_text())
    assert rates["nvimgcodec_per_gpu"] == 9500.0 and "nvimgcodec_towers_slowdown" not in rates


def test_the_rate_beside_a_compiled_tower_wins_and_other_variants_are_not_the_trainers(tmp_path):
    """The trainer compiles its towers on a GPU (model.compile: auto): a file of variants gives
    the rate of the row beside a compiled tower, never a variant the trainer does not run (a
    high-priority stream, several lanes)."""
    base = json.loads(decode_json(tmp_path, 3000.0, 1.12).read_text())["rows"][1]
    rows = [dict(base, variant="priority", images_per_s=9999.0, towers_compiled=False),
            dict(base, variant="lanes-4", images_per_s=8888.0, towers_compiled=False),
            dict(base, variant="none", images_per_s=3000.0, towers_compiled=False),
            dict(base, variant="compiled", images_per_s=2500.0, towers_slowdown=1.06, towers_compiled=True)]
    path = tmp_path / "variants.json"
    path.write_text(json.dumps({"meta": {}, "rows": rows}))
    out = tmp_path / "calibration"
    shutil.copytree(CALIBRATION, out)
    assert calibrate.main(["--decode", str(path), "--out", str(out)]) == 0
    rates = json.loads((out / "decode_rates.json").read_text())
    assert (rates["nvimgcodec_per_gpu"], rates["nvimgcodec_towers_slowdown"]) == (2500.0, 1.06)
    assert "(compiled)" in rates["nvimgcodec_source"]
    # without the compiled row, the eager one of the trainer's set-up
    path.write_text(json.dumps({"meta": {}, "rows": rows[:3]}))
    assert calibrate.main(["--decode", str(path), "--out", str(out)]) == 0
    rates = json.loads((out / "decode_rates.json").read_text())
    assert rates["nvimgcodec_per_gpu"] == 3000.0 and "(eager)" in rates["nvimgcodec_source"]
