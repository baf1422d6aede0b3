"""`python -m benchmarks.decode` on CPU: the machinery of the GPU decoder's rows (each library's
CPU decoder through the trainer's piece decoder, a tiny tower beside it) on small photo shards:
every row key of docs/benchmarks/decode.json, rows alone and beside training, and nvImageCodec's
count of the images it decoded itself."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infcl_ds.data.commands.photos import make_photo_shards

ROOT = Path(__file__).resolve().parents[1]
ROW_KEYS = {"decoder", "gpu_jpeg_library", "backend", "images_per_s", "beside_training", "host_us_per_image",
            "device", "commit", "shards", "bytes_per_image", "decoded_by_backend"}


def test_decoder_rows_alone_and_beside_a_tower(tmp_path):
    pytest.importorskip("nvidia.nvimgcodec")
    make_photo_shards(tmp_path / "photos", 48, 24, workers=1)
    out = tmp_path / "decode.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-m", "benchmarks.decode", "--shards", f"photos={tmp_path / 'photos'}",
                           "--images", "40", "--model", "infcl-tiny", "--chunk", "4", "--seconds", "1",
                           "--stream-priority", "high", "--switch-interval", "0.001", "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert {(r["gpu_jpeg_library"], r["beside_training"]) for r in rows} == {
        (library, beside) for library in ("nvimgcodec", "torchvision") for beside in (False, True)}
    for row in rows:
        assert ROW_KEYS <= set(row), ROW_KEYS - set(row)
        assert row["images"] == 40 and row["images_per_s"] > 0 and row["host_us_per_image"] >= 0
        assert row["stream_priority"] == -1 and row["switch_interval_s"] == pytest.approx(0.001)
        assert 20_000 < row["bytes_per_image"] < 60_000
        # the host time is the decoding thread's work (its CUDA waits left out) and the other
        # threads' (the library's), each part of the decoding thread timed
        assert row["host_us_per_image"] == pytest.approx(row["decoding_thread_us_per_image"]
                                                         + row["other_threads_us_per_image"])
        phases = row["phases_us_per_image"]
        assert set(phases) == {"jpeg library", "crop draws", "crop launch", "waiting for the GPU"}
        assert phases["jpeg library"]["wall"] > 0 and phases["crop launch"]["wall"] > 0
        work = sum(phases[p]["cpu"] for p in ("jpeg library", "crop draws", "crop launch"))
        assert work <= row["decoding_thread_us_per_image"] + 1.0
        assert phases["waiting for the GPU"]["cpu"] == pytest.approx(row["waiting_cpu_us_per_image"])
    nvimgcodec = [r for r in rows if r["gpu_jpeg_library"] == "nvimgcodec"]
    assert all(r["decoded_by_backend"] == 40 for r in nvimgcodec)  # its CPU backend decodes every photo
    beside = [r for r in rows if r["beside_training"]]
    assert all(r["towers_samples_per_s_alone"] > 0 and r["towers_slowdown"] > 0 for r in beside)
    assert all(r["towers_thread_us_per_image"] > 0 for r in beside)
    assert (tmp_path / "decode.png").is_file()


def test_the_tower_in_a_process_of_its_own_and_two_decoding_threads(tmp_path):
    make_photo_shards(tmp_path / "photos", 16, 16, workers=1)
    out = tmp_path / "decode.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-m", "benchmarks.decode", "--shards", f"photos={tmp_path / 'photos'}",
                           "--images", "16", "--libraries", "torchvision", "--model", "infcl-tiny", "--chunk", "4",
                           "--seconds", "1", "--towers-process", "--decode-threads", "2", "--piece", "4", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "towers alone: " in done.stdout and "in a process of their own" in done.stdout
    beside = [r for r in json.loads(out.read_text())["rows"] if r["beside_training"]]
    assert len(beside) == 1 and beside[0]["towers_in"] == "a process of their own"
    # the tower's passes came back from its process, and none of its CPU time is counted here
    assert beside[0]["towers_samples_per_s_alone"] > 0 and beside[0]["towers_slowdown"] > 0
    assert beside[0]["towers_thread_us_per_image"] == 0
    # two decoders on threads of their own, every piece decoded once: the library's part of
    # their host time is there, and no more than their threads' own CPU time
    row = beside[0]
    assert row["decode_threads"] == 2 and row["images"] == 16
    work = sum(row["phases_us_per_image"][p]["cpu"] for p in ("jpeg library", "crop draws", "crop launch"))
    assert 0 < work <= row["decoding_thread_us_per_image"] + 1.0


def test_the_library_log_keeps_the_lines_that_say_which_backend_and_why():
    from benchmarks.decode import telling_lines
    log = "\n".join(["\x1b[0;32m[INFO] \x1b[0m[nvimgcodec] HW decoder available num_hw_engines=7",
                     "[INFO] [nvimgcodec] Framework is unregistering decoder (id:nvjpeg_hw_decoder codec:jpeg)",
                     "[INFO] [nvimgcodec] Loading extension module:/x/libnvjpeg_ext.so",
                     "[WARNING] [nvimgcodec] decoder nvjpeg_hw_decoder failed #3. Trying next", "decoded 64"])
    assert telling_lines(log).splitlines() == ["[INFO] [nvimgcodec] HW decoder available num_hw_engines=7",
                                               "[WARNING] [nvimgcodec] decoder nvjpeg_hw_decoder failed #3. Trying next",
                                               "decoded 64"]


def test_zeroshot_runs_name_the_gpu_decoders_library_and_only_theirs(monkeypatch, tmp_path):
    """`bench decoders --gpu-jpeg-library nvimgcodec`: the GPU decoder's runs train with it and
    their rows say so; PIL's runs have no library."""
    import benchmarks.decoder_zeroshot as zeroshot
    seen = {}

    def fake_train(digits, run_dir, steps, sets, what):
        seen[what] = sets
        return {"zeroshot_top1": 0.9, "train_s": 1.0}

    monkeypatch.setattr(zeroshot, "train_digits", fake_train)
    gpu = zeroshot.train_once(tmp_path, "nvjpeg", 1, tmp_path / "a", 2, "nvimgcodec")
    cpu = zeroshot.train_once(tmp_path, "pil", 1, tmp_path / "b", 2, "nvimgcodec")
    assert gpu["gpu_jpeg_library"] == "nvimgcodec" and cpu["gpu_jpeg_library"] is None
    assert "data.gpu_jpeg_library=nvimgcodec" in seen["data.decoder=nvjpeg seed 1"]
    assert not any(s.startswith("data.gpu_jpeg_library") for s in seen["data.decoder=pil seed 1"])


def test_step_rows_pair_each_jpeg_step_with_the_synthetic_rate_of_its_own_run(tmp_path):
    """--steps-from: a JPEG row over the synthetic row of the same model, batch, cores, card and
    commit and settings; a row of another run gets no ratio; a scale part that sets a decoder says what the
    plan chose. The decoder rows already in decode.json stay."""
    from benchmarks.decode import main
    run = {"impl": "infcl_ds", "status": "measured", "model": "ViT-B-16", "B": 32768, "world": 1, "cores": 8,
           "device": "H100", "commit": "a", "command": "bench train"}
    train = [{**run, "data": "synthetic", "samples_per_s": 2000.0},
             {**run, "data": "jpeg", "samples_per_s": 1980.0, "decode_wait_share": 0.01, "decoder": "auto",
              "decoder_resolved": "hybrid", "gpu_jpeg_library": "nvimgcodec", "auto_line": "auto: data.decoder=hybrid"},
             {**run, "data": "jpeg", "samples_per_s": 1500.0, "decode_wait_share": 0.2, "decoder": "pil",
              "set": ["data.gpu_decode_lanes=2", "data.gpu_decode_lanes=4"]}]  # another run: its own settings
    scale = [{"part": "four-gpu-b32-2m", "model": "ViT-B-32", "B": 2097152, "world": 4, "samples_per_s": 30000.0,
              "decode_wait_share": 0.03, "step_s": 70.0, "device": "H100", "commit": "a",
              "part_sets": ["data.decoder=auto", "data.gpu_jpeg_library=nvimgcodec"],
              "planner_said": ["auto: data.decoder=hybrid (14 PIL processes decode ...); batch.chunk=256", "fits"]},
             {"part": "two-gpu-b32-1m", "model": "ViT-B-32", "B": 1048576, "world": 2, "samples_per_s": 7000.0,
              "step_s": 150.0, "decode_wait_share": 0.17, "device": "H200", "commit": "a",
              "part_sets": ["data.decoder=auto", "data.gpu_jpeg_library=nvimgcodec"],
              "set": ["data.gpu_jpeg_library=torchvision", "data.gpu_decode_lanes=4"]},
             {"part": "four-gpu-128k", "model": "ViT-B-16", "samples_per_s": 8000.0, "part_sets": []}]
    for name, rows in (("train.json", train), ("scale.json", scale)):
        (tmp_path / name).write_text(json.dumps({"meta": {}, "rows": rows}))
    out = tmp_path / "decode.json"
    out.write_text(json.dumps({"meta": {"device": "H100"}, "rows": [{"kind": "decoder", "images_per_s": 1.0},
                                                                     {"kind": "step", "model": "old"}]}))
    rows = main(["--steps-from", f"{tmp_path / 'train.json'},{tmp_path / 'scale.json'}", "--out", str(out)])
    assert rows == json.loads(out.read_text())["rows"]
    decoder, *steps = rows
    assert decoder == {"kind": "decoder", "images_per_s": 1.0} and len(steps) == 4
    paired, other, b32, lanes = steps
    assert paired["vs_synthetic"] == pytest.approx(0.99) and paired["decoder_resolved"] == "hybrid"
    assert paired["cores"] == 8 and paired["gpu_jpeg_library"] == "nvimgcodec"
    assert other["vs_synthetic"] is None and other["gpu_decode_lanes"] == 4 and paired["gpu_decode_lanes"] == 1
    assert b32["decoder"] == "auto" and b32["decoder_resolved"] == "hybrid" and b32["world"] == 4
    assert b32["gpu_jpeg_library"] == "nvimgcodec" and b32["decode_wait_share"] == 0.03
    # the invocation's --set comes after the part's own, as in the recipe it ran
    assert lanes["gpu_jpeg_library"] == "torchvision" and lanes["gpu_decode_lanes"] == 4


def test_the_gpu_plan_script_lists_its_parts_without_running_any():
    done = subprocess.run(["bash", str(ROOT / "launch" / "bench_decode.sh")], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2
    for part in ("decoders", "b16-8cores", "l14-4cores", "zeroshot", "b32-2m", "b32-1m", "steps"):
        assert f"bench_decode.sh {part}" in done.stderr, done.stderr


def test_a_backend_that_leaves_images_to_pil_is_not_timed_and_keeps_the_librarys_log(monkeypatch, tmp_path):
    import benchmarks.decode as decode
    monkeypatch.setattr(decode, "decoded_by_backend", lambda *a: 3)
    monkeypatch.setattr(decode, "library_log", lambda *a: "HW decoder not supported by this platform. Skip.")
    rows = decode.decoder_rows("photos", tmp_path, [b"\xff\xd8"] * 8, [("nvimgcodec", "hardware", ("HW_GPU_ONLY",), None)],
                               "cpu", {"samples_per_s": 1.0, "cpu_per_s": 1.0}, 4, "infcl-tiny")
    assert [r["beside_training"] for r in rows] == [False, True]
    for row in rows:
        assert row["images_per_s"] is None and row["decoded_by_backend"] == 3
        assert row["not_timed"] == "the backend decoded 3 of 8 images itself"
        assert row["library_log"].startswith("HW decoder not supported")


def test_variant_files_are_gathered_each_row_naming_its_variant(tmp_path):
    from benchmarks.decode import main
    row = {"kind": "decoder", "shards": "photos", "gpu_jpeg_library": "torchvision", "backend": "nvjpeg",
           "beside_training": True, "images_per_s": 3000.0, "host_us_per_image": 400.0, "towers_slowdown": 1.1,
           "commit": "abc1234", "device": "NVIDIA H200"}
    sources = []
    for name, rate in (("decode", 3000.0), ("decode_lanes-4", 7000.0)):
        path = tmp_path / name / f"{name}.json"  # folders of their own: each command's $OUT
        path.parent.mkdir()
        step = {"kind": "step", "model": "ViT-B-16"}  # decode.json's step rows are not a variant's
        path.write_text(json.dumps({"meta": {"device": "NVIDIA H200", "commit": "abc1234", "command": "x"},
                                    "rows": [{**row, "images_per_s": rate}, step]}))
        sources.append(str(path))
    out = tmp_path / "decode_variants.json"
    rows = main(["--variants-from", ",".join(sources), "--out", str(out)])
    assert [(r["variant"], r["images_per_s"]) for r in rows] == [("none", 3000.0), ("lanes-4", 7000.0)]
    meta = json.loads(out.read_text())["meta"]
    assert meta["device"] == "NVIDIA H200" and meta["commits"] == ["abc1234"] and "command" not in meta
    assert out.with_suffix(".png").is_file()
