"""`infcl-ds bench train` on CPU (2 gloo ranks, the tiny model): this engine's rows and OpenCLIP's
own trainer's (`--impl open_clip_train`) in one JSON with the fields docs/benchmarks/vs_open_clip.json
needs, a later run replacing only its own configuration's rows, the comparison plot, and nothing
written to the working directory (open_clip_train's logs go to a temporary directory)."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIELDS = {"impl", "model", "B", "world", "compile", "zero", "samples_per_s", "step_s", "first_step_s", "device",
          "command", "status"}


def _bench(cwd, out, *args):
    env = dict(os.environ, DS_ACCELERATOR="cpu", MASTER_ADDR="127.0.0.1", OMP_NUM_THREADS="1",
               PYTHONPATH=str(ROOT))
    argv = [sys.executable, "-m", "infcl_ds.cli", "bench", "train", "--model", "infcl-tiny", "--batch", "128",
            "--chunk", "auto", "--world", "2", "--steps", "1", "--open-clip-train-batch-size", "32",
            "--open-clip-train-modes", "eager", "--append", "--out", str(out), *args]
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads(out.read_text())["rows"]


def test_engine_and_open_clip_train_rows_side_by_side(tmp_path):
    work, out = tmp_path / "cwd", tmp_path / "out" / "vs.json"
    work.mkdir()
    rows = _bench(work, out, "--impl", "open_clip_train,infcl_ds")
    assert [(r["impl"], r["status"]) for r in rows] == [("open_clip_train", "measured"), ("infcl_ds", "measured")]
    for row in rows:
        assert FIELDS <= set(row), FIELDS - set(row)
        assert row["model"] == "infcl-tiny" and row["B"] == 128 and row["world"] == 2 and row["compile"] is False
        assert row["samples_per_s"] > 0 and row["first_step_s"] > 0
    ours, theirs = rows[1], rows[0]
    # --chunk auto on CPU ranks: 64 samples, the whole local batch here.
    assert ours["chunk"] == 64 and ours["zero"] == 2 and ours["samples_per_s"] == 128 / ours["step_s"]
    assert "--accum-freq 2" in theirs["command"] and "--local-loss --gather-with-grad" in theirs["command"]
    assert list(work.iterdir()) == []  # open_clip_train wrote its logs elsewhere
    assert out.with_suffix(".png").stat().st_size > 10_000

    # A ZeRO-0 run of this engine adds its row; the ZeRO-2 row and open_clip_train's stay.
    rows = _bench(work, out, "--impl", "infcl_ds", "--zero", "0")
    assert sorted((r["impl"], r["zero"]) for r in rows) == [("infcl_ds", 0), ("infcl_ds", 2), ("open_clip_train", None)]
    # The same configuration again replaces its row.
    rows = _bench(work, out, "--impl", "infcl_ds", "--zero", "0")
    assert len(rows) == 3


def test_profile_sorts_kernels_by_kind_and_counts_idle_time():
    """bench train --profile: kernel names as the profiler reports them on an H100/H200 (eager
    and compiled towers, SDPA backends, our loss kernels, ZeRO's NCCL) fall in their kinds; the
    shares are of the step's wall time and the rest is the GPU's idle time."""
    from benchmarks.profile import kernel_table, kind_of
    expected = {
        "nvjet_tst_192x192_64x4_2x1_v_bz_coopB_TNN": "GEMMs",
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1": "GEMMs",
        "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8>": "GEMMs",
        "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4>, false>": "attention",
        "fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel)": "attention",
        "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x64": "attention",
        "triton_red_fused__to_copy_add_native_layer_norm_0": "norms and elementwise",
        "triton_poi_fused_gelu_1": "norms and elementwise",
        "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>": "norms and elementwise",
        "_similarity_lse_kernel": "contrastive loss",
        "_grad_panel_kernel": "contrastive loss",
        "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)": "communication",
        "Memcpy HtoD (Pinned -> Device)": "input transfer",
        "Memcpy DtoD (Device -> Device)": "other copies",
        "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>": "optimizer",
    }
    assert {name: kind_of(name) for name in expected} == expected
    table = kernel_table([("nvjet_x", 6.0), ("triton_poi_fused_add_0", 2.0), ("flash_fwd_kernel", 1.0),
                          ("Memcpy HtoD (Pinned -> Device)", 0.5)], wall_s=10.0)
    kinds = table["kinds"]
    assert kinds["GEMMs"] == {"s": 6.0, "share": 0.6} and kinds["norms and elementwise"]["s"] == 2.0
    assert kinds["input transfer"]["share"] == 0.05 and kinds["communication"]["s"] == 0.0
    assert abs(kinds["GPU idle"]["s"] - 0.5) < 1e-12 and table["attention_kernels"] == ["flash_fwd_kernel"]
    assert abs(sum(k["share"] for k in kinds.values()) - 1.0) < 1e-12
    # the kernels that took the most time, summed over their calls, largest first
    table = kernel_table([("b", 1.0), ("nvjet_x", 2.0), ("b", 1.5), ("c", 0.1)], wall_s=5.0)
    assert [(k["name"], k["kind"], k["s"], k["calls"]) for k in table["top_kernels"]] == [
        ("b", "norms and elementwise", 2.5, 2), ("nvjet_x", "GEMMs", 2.0, 1), ("c", "norms and elementwise", 0.1, 1)]


def test_open_clip_train_logits_size_decides_rows_it_cannot_run():
    from benchmarks.open_clip_train import logits_bytes
    # ViT-B-16 at 256k on one GPU: two 262,144^2 bf16 matrices, 256 GiB, more than an H200's 139.8 GiB
    assert logits_bytes(262144, 1, "amp_bf16") == 2 * 262144 ** 2 * 2 == 256 * 2 ** 30
    # 32k on one GPU fits (4 GiB); over 8 ranks each holds local x global; fp32 doubles it
    assert logits_bytes(32768, 1, "amp_bf16") == 4 * 2 ** 30
    assert logits_bytes(32768, 8, "fp32") == 2 * 4096 * 32768 * 4


def test_open_clip_train_failure_names_its_error_line_not_the_compilers_exit_noise():
    from benchmarks.open_clip_train import failure_line
    # the H100 log of `--torchcompile` at --batch-size 1024: the error, then the compiler's cache statistics
    log = "\n".join(["2026-11-25,14:13:50 | INFO | Start epoch 0",
                     "Traceback (most recent call last):",
                     '  File "open_clip_train/main.py", line 1, in main',
                     "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.25 GiB. GPU 0 has a total "
                     "capacity of 79.19 GiB of which 1.02 GiB is free.",
                     "I1125 14:13:57.028000 1076 torch/_subclasses/fake_tensor.py:3434]   cache_bypasses:",
                     "I1125 14:13:57.028000 1076 torch/_subclasses/fake_tensor.py:3437]     unsafe view: 144"])
    assert failure_line(log).startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.25 GiB")
    assert failure_line("ValueError: bad --model\nsome exit line") == "ValueError: bad --model"
    # two ranks under torchrun: the rank's error, not torchrun's summary after it
    assert failure_line("[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1 GiB\n"
                        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:") == \
        "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1 GiB"
    assert failure_line("just logs\nno error") == ""


def test_open_clip_train_row_of_a_run_out_of_memory_says_what_would_fit(monkeypatch):
    from benchmarks.train import _open_clip_train_run

    def out_of_memory(*args, **kwargs):
        raise RuntimeError("open_clip_train exited with 1: torch.OutOfMemoryError: CUDA out of memory.\nlog tail")

    argv = ["--model", "ViT-B-16", "--batch-size", "1024", "--accum-freq", "32"]
    row = _open_clip_train_run(out_of_memory, 1, argv, [], 2, 32768)
    assert row["status"] == "out of memory"
    assert row["error"] == "open_clip_train exited with 1: torch.OutOfMemoryError: CUDA out of memory."
    assert "--batch-size 1024 does not fit" in row["reason"]

    def broken(*args, **kwargs):
        raise RuntimeError("open_clip_train exited with 2: ValueError: bad --model\nlog tail")

    row = _open_clip_train_run(broken, 1, argv, [], 1, 32768)
    assert row["status"] == "failed" and row["error"].endswith("ValueError: bad --model")
    assert row["log_tail"].endswith("log tail")


def test_jpeg_rows_beside_synthetic_ones_from_the_trainers_data_path(tmp_path):
    """--data synthetic,jpeg: the same engine timed on pinned random pixels and on JPEG shards read
    and decoded as the trainer does (encoded host batches, the decode pool, keep auto), one row
    each, with the decode wait and the planner's step; epochs roll over when the steps need it."""
    from infcl_ds.data.commands.photos import main as photos
    shards, work, out = tmp_path / "photos", tmp_path / "cwd", tmp_path / "real_data.json"
    work.mkdir()
    assert photos(["--out", str(shards), "--samples", "96", "--shard-size", "48", "--workers", "1"]) in (0, None)
    rows = _bench(work, out, "--impl", "infcl_ds", "--world", "1", "--batch", "64", "--steps", "2",
                  "--data", "synthetic,jpeg", "--shards", str(shards), "--decode-workers", "1", "--decoder", "auto")
    assert [(r["data"], r["status"]) for r in rows] == [("synthetic", "measured"), ("jpeg", "measured")]
    jpeg = rows[1]
    assert FIELDS <= set(jpeg) and jpeg["decoder"] == "auto" and jpeg["keep_decoded_gib"] == 1.0
    # what the rank's plan made of `auto`, and why, in the row
    assert jpeg["decoder_resolved"] == "pil" and jpeg["decode_workers"] == 1 and jpeg["cores"] >= 1
    assert "data.decoder=pil (no GPU on this rank)" in jpeg["auto_line"], jpeg["auto_line"]
    assert 0 <= jpeg["decode_wait_share"] < 1 and jpeg["plan_step_s"] > 0 and jpeg["samples_per_s"] > 0
    assert "--data synthetic,jpeg" in jpeg["command"]
