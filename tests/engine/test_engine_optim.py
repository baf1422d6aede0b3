"""OpenCLIP's decay rule and CLIP's AdamW defaults, decided on the unwrapped model."""
import math

import pytest
import torch

from infcl_ds.config.recipe import OptimizerSection
from infcl_ds.engine.optim import clip_adamw, clip_param_groups

pytestmark = pytest.mark.gpu


class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)
        self.ln_final = torch.nn.LayerNorm(4)
        self.logit_scale = torch.nn.Parameter(torch.tensor(math.log(1 / 0.07)))
        self.text_projection = torch.nn.Parameter(torch.randn(4, 4))


def test_decay_groups_follow_open_clip():
    m = M()
    no_decay, decay = clip_param_groups(m, OptimizerSection().weight_decay)
    names = {id(p): n for n, p in m.named_parameters()}
    assert {names[id(p)] for p in decay["params"]} == {"proj.weight", "text_projection"}
    assert {names[id(p)] for p in no_decay["params"]} == {"proj.bias", "ln_final.weight", "ln_final.bias", "logit_scale"}
    assert no_decay["weight_decay"] == 0.0 and decay["weight_decay"] == 0.2


def test_clip_adamw_defaults():
    opt = clip_adamw(M(), OptimizerSection(lr=1e-3))
    assert opt.defaults["betas"] == (0.9, 0.98) and opt.defaults["eps"] == 1e-6


def test_alignment_puts_odd_sized_tensors_last():
    from infcl_ds.engine.params import align_for_flat_buffers

    class Wide(torch.nn.Module):  # widths of 8: every tensor but the logit scale 16 bytes in bf16
        def __init__(self):
            super().__init__()
            self.proj, self.ln_final = torch.nn.Linear(8, 8), torch.nn.LayerNorm(8)
            self.logit_scale = torch.nn.Parameter(torch.zeros(1))
    m = Wide()
    opt = clip_adamw(m, OptimizerSection(lr=1e-3))
    align_for_flat_buffers(opt, zero3=False)  # ZeRO-1/2: within each group, groups kept
    assert [g["weight_decay"] for g in opt.param_groups] == [0.0, 0.2]
    assert opt.param_groups[0]["params"][-1] is m.logit_scale
    align_for_flat_buffers(opt, zero3=True)
    flat = [p for group in opt.param_groups for p in group["params"]]
    # ZeRO-3 packs the groups back to back: the one 2-byte tensor must come last of all.
    assert flat[-1] is m.logit_scale and all(p.numel() % 8 == 0 for p in flat[:-1])
    assert [g["weight_decay"] for g in opt.param_groups] == [0.2, 0.0]
    # Groups with their own learning rates keep their order (a scheduler lists base rates by position).
    opt = clip_adamw(m, OptimizerSection(lr=1e-3))
    opt.param_groups[1]["lr"] = 2e-3
    align_for_flat_buffers(opt, zero3=True)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.0, 0.2]
    assert opt.param_groups[0]["params"][-1] is m.logit_scale


def _weight_offsets(rank, world, stage):
    """Every parameter as the forward sees it (ZeRO-3: gathered): (its offset in its storage, its
    storage's address), each in bytes modulo 16. The first is the flat buffers' packing, the
    second the allocator's: a failure says which one moved a weight."""
    from devices import exact_loss

    from infcl_ds.engine import ContrastiveEngine, EngineSettings
    from infcl_ds.models import create_model
    model = create_model("infcl-tiny", seed=0)
    config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
              "bf16": {"enabled": True}, "zero_optimization": {"stage": stage}}
    step = ContrastiveEngine.create(model, config, EngineSettings(4), loss_fn=exact_loss(),
                                    optimizer=clip_adamw(model, OptimizerSection(lr=1e-3)))
    offsets = {}

    def recorder(prefix):
        def record(module, args):
            for name, p in module.named_parameters(recurse=False):
                offsets[f"{prefix}.{name}"] = (p.storage_offset() * p.element_size() % 16,
                                               p.untyped_storage().data_ptr() % 16)
        return record
    for prefix, module in step.model.named_modules():
        module.register_forward_pre_hook(recorder(prefix))
    images = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(rank))
    step.forward_backward(images, torch.randint(0, 1000, (4, 16), generator=torch.Generator().manual_seed(rank)))
    return offsets


def test_every_weight_reaches_the_forward_16_byte_aligned():
    """cuBLAS's Hopper GEMMs need 16-byte aligned operands (a misaligned weight ran 7.6x slower on
    an H200): DeepSpeed's flat buffers must not shift the weights behind the [1] logit scale."""
    from dist_utils import run_ranks
    for stage, world in ((2, 1), (3, 1), (3, 2)):
        for rank, offsets in run_ranks(_weight_offsets, world, stage).items():
            assert offsets and len(offsets) > 10, offsets
            misaligned = {k: v for k, v in offsets.items() if any(v) and "logit_scale" not in k}
            assert not misaligned, (stage, world, rank, misaligned)


def _zero3_checkpoint_round_trip(rank, world, tmp, save_in_old_order):
    import infcl_ds.engine.params as params
    from devices import exact_loss

    from infcl_ds.checkpoint import rng, store, tags
    from infcl_ds.checkpoint.safe_load import CheckpointError
    from infcl_ds.engine import ContrastiveEngine, EngineSettings
    from infcl_ds.models import create_model
    config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
              "bf16": {"enabled": True}, "zero_optimization": {"stage": 3}}

    def engine():
        model = create_model("infcl-tiny", seed=0)
        return ContrastiveEngine.create(model, config, EngineSettings(4), loss_fn=exact_loss(),
                                        optimizer=clip_adamw(model, OptimizerSection(lr=1e-3)))
    aligned = params.align_for_flat_buffers
    if save_in_old_order:  # the optimizer groups as they were packed before the alignment order
        params.align_for_flat_buffers = lambda optimizer, zero3: None
    writer = engine()
    params.align_for_flat_buffers = aligned
    writer.forward_backward(torch.randn(4, 3, 16, 16), torch.randint(0, 1000, (4, 16)))
    writer.deepspeed.step()
    store.save(writer.deepspeed, tmp, 1, {"rng": rng.rng_state()}, rank)
    try:
        store.load(engine().deepspeed, tags.resolve_tag(tmp), rank)
    except CheckpointError as err:
        return str(err)
    return "loaded"


def test_a_zero3_checkpoint_packed_in_another_order_is_a_checkpoint_error(tmp_path):
    from dist_utils import run_ranks
    assert run_ranks(_zero3_checkpoint_round_trip, 1, str(tmp_path / "same"), False)[0] == "loaded"
    message = run_ranks(_zero3_checkpoint_round_trip, 1, str(tmp_path / "old"), True)[0]
    assert "does not match this engine's parameters" in message and "size of tensor" in message, message
