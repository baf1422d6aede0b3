"""The towers' chunk passes alone (no DeepSpeed, no loss), per implementation choice: eager or
compiled; the attention from the packed projection and the patch embedding as a GEMM
(engine/towers.py) or cuDNN with or without `cudnn.benchmark`. One GPU:

    PYTHONPATH=$PWD python3 launch/probe_towers.py OUT.json [ViT-B-16:1024:4 ViT-L-14:512:2 ...]

Each MODEL:CHUNK:K times K no-grad chunk passes and K forward+backward chunk passes of
`model(images, texts)` in bf16, as the engine's steps run them; the mean of 3 rounds after 2
untimed ones. Rows are written to OUT.json as each variant ends, with the run's device and
versions (`python -m benchmarks.plot_towers OUT.json` draws them). Used to choose the compiled
towers' implementation; not a benchmark of record.
"""
import json
import os
import sys
import time

import torch

from infcl_ds.engine.compile import compile_encoders
from infcl_ds.engine.float8 import float8_linears
from infcl_ds.engine.towers import fast_tower_modules
from infcl_ds.models import create_model

# Inductor's GEMMs autotuned among cuBLAS and its own Triton templates (Hopper's TMA ones too),
# whose epilogues can take the elementwise work after a GEMM (bias, GELU) into the GEMM's kernel.
MAX_AUTOTUNE = {"max_autotune": True, "triton.enable_persistent_tma_matmul": True}

VARIANTS = [  # name, compiled (False, or inductor's options), packed attention, patch GEMM, cudnn.benchmark, float8 recipe[, MLP epilogue]
    ("eager", False, False, False, False, False),
    ("eager+packed+patch_gemm", False, True, True, False, False),
    ("compiled", {}, False, False, False, False),
    ("compiled+cudnn_benchmark", {}, False, False, True, False),
    ("compiled+packed", {}, True, False, False, False),
    ("compiled+packed+patch_gemm", {}, True, True, False, False),
    ("compiled+packed+cudnn_benchmark", {}, True, False, True, False),
    ("compiled+packed+patch_gemm+max_autotune", MAX_AUTOTUNE, True, True, False, False),
    # model.float8: torchao's float8 training (rowwise scales) on the towers' linear layers
    ("compiled+packed+patch_gemm+float8", {}, True, True, False, "rowwise"),
    ("compiled+packed+patch_gemm+float8_tensorwise", {}, True, True, False, "tensorwise"),
    # the weight-gradient GEMM in bf16: fewer casts in the backward (rowwise's grad pass was its loss)
    ("compiled+packed+patch_gemm+float8_rowwise_with_gw_hp", {}, True, True, False, "rowwise_with_gw_hp"),
    # the no-grad pass's c_fc bias and GELU in cuBLASLt's GEMM epilogue (engine/towers.py's EpilogueGeluMlp)
    ("compiled+packed+patch_gemm+mlp_epilogue", {}, True, True, False, False, True),
]


def run(name, chunk, k, compiled, packed, patch_gemm, benchmark, float8, mlp_epilogue=False):
    torch._dynamo.reset()
    torch.backends.cudnn.benchmark = benchmark
    model = create_model(name, seed=0).cuda().bfloat16()
    fast_tower_modules(model, attention=packed, patch_embedding=patch_gemm, mlp_epilogue=mlp_epilogue)
    float8_layers = len(float8_linears(model, recipe=float8)) if float8 else 0  # model.float8's layers (engine/float8.py)
    if compiled is not False:
        compile_encoders(model, options=compiled or None)
    size = model.visual.preprocess_cfg["size"]
    size = size if isinstance(size, int) else size[0]
    gen = torch.Generator(device="cuda").manual_seed(0)
    images = torch.randn(chunk, 3, size, size, device="cuda", dtype=torch.bfloat16, generator=gen)
    texts = torch.randint(1, 49000, (chunk, model.context_length), device="cuda", generator=gen)
    gi = torch.randn(chunk, model.visual.output_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
    gt = torch.randn_like(gi)

    def one_round():
        events = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
        events[0].record()
        with torch.no_grad():
            for _ in range(k):
                fi, ft, *_ = model(images, texts)
        events[1].record()
        for _ in range(k):
            fi2, ft2, *_ = model(images, texts)
            ((fi2 * gi).float().sum() + (ft2 * gt).float().sum()).backward()
        events[2].record()
        torch.cuda.synchronize()
        return events[0].elapsed_time(events[1]) / 1e3, events[1].elapsed_time(events[2]) / 1e3, fi, ft

    t0 = time.time()
    one_round()
    first = time.time() - t0
    one_round()
    rounds = [one_round() for _ in range(3)]
    nograd = sum(r[0] for r in rounds) / 3 / k
    grad = sum(r[1] for r in rounds) / 3 / k
    feats = torch.cat([rounds[-1][2][:64].float(), rounds[-1][3][:64].float()], 1).cpu()
    del model
    torch.cuda.empty_cache()
    return {"float8_layers": float8_layers, "first_round_s": first, "nograd_chunk_s": nograd, "grad_chunk_s": grad,
            "s_per_sample_4_passes": (nograd + grad) / chunk,
            "peak_mib": torch.cuda.max_memory_allocated() / 2**20}, feats


def main():
    out = sys.argv[1]
    specs = sys.argv[2:] or ["ViT-B-16:1024:4"]
    only = os.environ.get("VARIANTS")
    # Only when named: max-autotune did not finish compiling ViT-L-14's towers in 560 s on an H100.
    skipped_by_default = {"compiled+packed+patch_gemm+max_autotune"}
    rows = []
    try:
        import torchao
        torchao_version = torchao.__version__
    except ImportError:
        torchao_version = None
    commit = os.environ.get("INFCL_DS_COMMIT", "unknown")
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "torchao": torchao_version,
            "commit": commit, "model": ",".join(spec.split(":")[0] for spec in specs), "command": " ".join(sys.argv)}
    for spec in specs:
        name, chunk, k = spec.split(":")
        base = None
        for variant in VARIANTS:
            if (variant[0] not in only.split(",")) if only else (variant[0] in skipped_by_default):
                continue
            torch.cuda.reset_peak_memory_stats()
            row, feats = run(name, int(chunk), int(k), *variant[1:])
            if base is None:
                base = feats
            row.update(model=name, chunk=int(chunk), variant=variant[0], run=commit,
                       features_rel_diff_vs_first=((feats - base).norm() / base.norm()).item(),
                       device=torch.cuda.get_device_name(), torch=torch.__version__)
            rows.append(row)
            print(json.dumps(row), flush=True)
            with open(out, "w") as f:  # the record benchmarks/plot_towers.py draws
                json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
