"""A chunked engine step on 2 gloo ranks equals a single-process, unchunked, plain-PyTorch
step on the whole global batch (full-logit loss): full gradients (safe_get_full_grad) to
1e-5 relative, and the parameters after 3 SGD and after 3 AdamW steps, for ZeRO 0-3 in fp32
(and ZeRO-2 with the cached features offloaded to host memory)."""
import math

import pytest
import torch

from reference import full_logits_loss, reference_steps
from devices import exact_loss
from dist_utils import run_ranks

pytestmark = pytest.mark.gpu

GLOBAL, LOCAL, CHUNK = 14, 7, 3


class Tower(torch.nn.Sequential):
    """A tower of its own class with its own forward, as a real model's are: torch.compile
    (torch 2.11) compiles nothing of a bare torch.nn module, whose forward lives in torch."""

    def forward(self, x):
        for layer in self:
            x = layer(x)
        return x


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.visual = Tower(torch.nn.Linear(12, 24), torch.nn.GELU(), torch.nn.Linear(24, 16))
        self.text = Tower(torch.nn.Linear(10, 16))
        self.logit_scale = torch.nn.Parameter(torch.tensor(math.log(10.0)))

    def encode_image(self, x):
        return self.visual(x)

    def encode_text(self, t):
        return self.text(t)


def batch():
    g = torch.Generator().manual_seed(5)
    return torch.randn(GLOBAL, 12, generator=g), torch.randn(GLOBAL, 10, generator=g)


def _config(stage, **extra):
    return {"train_micro_batch_size_per_gpu": CHUNK, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
            "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True, **extra}


def _full_params(step):
    from deepspeed.utils import safe_get_full_fp32_param
    out = {}
    for n, p in step.model.named_parameters():
        master = safe_get_full_fp32_param(p)  # None without a ZeRO optimizer: the parameter is it
        out[n] = (master if master is not None else p.detach()).clone()
    return out


def _engine_run(rank, world, stage, offload, chunk=CHUNK):
    """Gradients of one chunked step, then parameters after 3 SGD and after 3 AdamW steps."""
    from deepspeed.utils import safe_get_full_grad

    from infcl_ds.engine import ContrastiveEngine, EngineSettings
    images, texts = batch()
    lo = rank * LOCAL
    local = (images[lo:lo + LOCAL], texts[lo:lo + LOCAL])
    out = {}
    model = Tiny()
    step = ContrastiveEngine.create(model, _config(stage), EngineSettings(chunk, offload_features=offload),
                                    loss_fn=exact_loss(), optimizer=torch.optim.SGD(model.parameters(), lr=0.5))
    forwards = []
    model.visual.register_forward_hook(lambda *_: forwards.append(1))
    out["loss"] = step.forward_backward(*local).item()
    out["forwards"] = len(forwards)
    out["grads"] = {n: safe_get_full_grad(p).clone() for n, p in step.model.named_parameters()}
    step.deepspeed.step()
    step._clamp_logit_scale(math.log(100.0))
    for _ in range(2):
        step.train_step(*local)
    out["sgd"] = _full_params(step)
    model = Tiny()
    step = ContrastiveEngine.create(model, _config(stage), EngineSettings(chunk), loss_fn=exact_loss(),
                                    optimizer=torch.optim.AdamW(model.parameters(), lr=0.05))
    for _ in range(3):
        step.train_step(*local)
    out["adamw"] = _full_params(step)
    return out


def reference_run():
    """The same three things, unchunked, in one process, with the full-logit loss."""
    import torch.nn.functional as F
    images, texts = batch()

    def loss_of(model):
        fi = F.normalize(model.encode_image(images), dim=-1)
        ft = F.normalize(model.encode_text(texts), dim=-1)
        return full_logits_loss(fi, ft, model.logit_scale.exp())

    def train(opt_cls, lr):
        return reference_steps(Tiny(), loss_of, opt_cls, lr, 3)

    model = Tiny()
    loss = loss_of(model)
    loss.backward()
    return {"loss": loss.item(), "grads": {n: p.grad.clone() for n, p in model.named_parameters()},
            "sgd": train(torch.optim.SGD, 0.5), "adamw": train(torch.optim.AdamW, 0.05)}


def _rel(got, want):
    got = got.reshape(want.shape).double()  # logit_scale: [1] inside DeepSpeed
    return ((got - want.double()).norm() / want.double().norm()).item()


@pytest.mark.parametrize("stage,offload", [(0, False), (1, False), (2, False), (3, False), (2, True)])
def test_chunked_steps_equal_plain_steps(stage, offload):
    # Gradients and SGD are the real check of the gradient scale; Adam's first step hides it.
    ref = reference_run()
    results = run_ranks(_engine_run, 2, stage, offload)
    for rank in range(2):
        assert abs(results[rank]["loss"] - ref["loss"]) < 1e-5 * abs(ref["loss"])
        for what in ("grads", "sgd", "adamw"):
            for name, want in ref[what].items():
                err = _rel(results[rank][what][name], want)
                assert err < 1e-5, (stage, rank, what, name, err)


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_a_local_batch_of_one_chunk_is_encoded_once(stage):
    """Chunk >= local batch: one forward with grad instead of a no-grad pass and a re-encode
    (not under ZeRO-3, which keeps both passes), and the same gradients and steps."""
    ref = reference_run()
    results = run_ranks(_engine_run, 2, stage, False, LOCAL)
    for rank in range(2):
        assert results[rank]["forwards"] == (2 if stage == 3 else 1)
        assert abs(results[rank]["loss"] - ref["loss"]) < 1e-5 * abs(ref["loss"])
        for what in ("grads", "sgd", "adamw"):
            for name, want in ref[what].items():
                err = _rel(results[rank][what][name], want)
                assert err < 1e-5, (stage, rank, what, name, err)


class TinyWithDropout(Tiny):
    def __init__(self):
        super().__init__()
        self.visual = Tower(self.visual[0], torch.nn.Dropout(0.5), *self.visual[1:])


def _dropout_replay(rank, world, replay):
    import infcl_ds.engine.step as step_module
    from infcl_ds.engine import ContrastiveEngine, EngineSettings
    if not replay:  # break the replay: every chunk re-encodes with fresh randomness
        step_module._set_rng_state = lambda state, device: None
    model = TinyWithDropout()
    config = {"train_micro_batch_size_per_gpu": CHUNK, "gradient_accumulation_steps": 1,
              "gradient_clipping": 0.0, "zero_optimization": {"stage": 2}, "zero_allow_untested_optimizer": True}
    step = ContrastiveEngine.create(model, config, EngineSettings(CHUNK, verify_replay=True), loss_fn=exact_loss(),
                                    optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    images, texts = batch()
    try:
        step.forward_backward(images[rank * LOCAL:(rank + 1) * LOCAL], texts[rank * LOCAL:(rank + 1) * LOCAL])
    except RuntimeError as err:
        return str(err)
    return "replayed"


def test_dropout_is_replayed_exactly():
    # The re-encoded chunks reproduce the cached features bit for bit with the saved RNG
    # states (so the cached gradients apply), and visibly not without them.
    assert run_ranks(_dropout_replay, 2, True) == {0: "replayed", 1: "replayed"}
    broken = run_ranks(_dropout_replay, 2, False)
    assert all("not replayed" in broken[r] for r in range(2)), broken


def _compiled_run(rank, world, backend):
    """Gradients of a chunked step (a remainder chunk included) and the graphs compiled after
    steps 1, 2 and 3, with the towers compiled by `backend` (None: eager)."""
    from deepspeed.utils import safe_get_full_grad

    from infcl_ds.engine import ContrastiveEngine, EngineSettings
    from infcl_ds.engine.compile import graphs_compiled
    images, texts = batch()
    lo = rank * LOCAL
    local = (images[lo:lo + LOCAL], texts[lo:lo + LOCAL])
    model = Tiny()
    step = ContrastiveEngine.create(model, _config(2), EngineSettings(CHUNK, compile_backend=backend),
                                    loss_fn=exact_loss(), optimizer=torch.optim.SGD(model.parameters(), lr=0.5))
    loss = step.forward_backward(*local).item()
    grads = {n: safe_get_full_grad(p).clone() for n, p in step.model.named_parameters()}
    step.deepspeed.step()
    graphs = [graphs_compiled()]
    for _ in range(2):
        step.train_step(*local)
        graphs.append(graphs_compiled())
    return {"loss": loss, "grads": grads, "graphs": graphs, "keys": sorted(step.model.state_dict())}


def test_compiled_encoders_give_the_eager_gradients_and_compile_once():
    """model.compile: the towers compiled in place (aot_eager here: torch.compile's tracing and
    autograd split without the C++ code generation, which takes minutes on 2 CPU cores) give the
    eager step's loss and gradients to 1e-6, keep the state dict's keys, and compile nothing
    after the first step (chunks of 3, 3 and a remainder of 1, in both passes)."""
    eager = run_ranks(_compiled_run, 2, None)
    compiled = run_ranks(_compiled_run, 2, "aot_eager")
    for rank in range(2):
        assert compiled[rank]["keys"] == eager[rank]["keys"]
        assert abs(compiled[rank]["loss"] - eager[rank]["loss"]) < 1e-6 * abs(eager[rank]["loss"])
        for name, want in eager[rank]["grads"].items():
            assert _rel(compiled[rank]["grads"][name], want) < 1e-6, name
        first, *later = compiled[rank]["graphs"]
        assert first > 0 and all(g == first for g in later), compiled[rank]["graphs"]
        assert eager[rank]["graphs"] == [0, 0, 0]


def test_compiled_encoders_are_refused_under_zero3_in_the_recipe_s_words():
    from infcl_ds.config.recipe import compile_stage_refusal
    from infcl_ds.engine import ContrastiveEngine, EngineSettings
    model = Tiny()
    with pytest.raises(ValueError) as refused:
        ContrastiveEngine.create(model, _config(3), EngineSettings(CHUNK, compile_backend="aot_eager"))
    assert str(refused.value) == compile_stage_refusal(3)
    assert "model.compile" in str(refused.value) and "zero.stage=3" in str(refused.value)
    assert model.logit_scale.dim() == 0  # refused before the model was changed (DeepSpeed's [1])
