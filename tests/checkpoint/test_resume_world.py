"""A checkpoint resumes on another number of ranks: 2 -> 1, 1 -> 2 and 2 -> 4 gloo ranks, ZeRO 0
to 3 each resumed at a different world size. The tiny recipe on synthetic data, fp32.

Checked for each case, against the uninterrupted run that wrote the checkpoint:
- right after the resume, every parameter's weight as the forward sees it, its fp32 master
  weight and Adam moments, the Adam step and each optimizer group's settings (rate, weight
  decay, betas, eps) are bit-identical to the writing ranks' at that step;
- the global samples taken after the resume (each global batch: rank 0's rows, then rank 1's)
  are the uninterrupted run's;
- the parameters after the further steps equal the uninterrupted run's within 1e-6 of the
  model's largest weight. Between world sizes the gradients are summed in another order; Adam
  turns the rounding noise of gradients that are zero in exact arithmetic (attention's key
  bias) into steps of the learning rate's size, so two uninterrupted runs on 1 and 2 ranks
  differ by ~1e-2 of a zero-initialised bias at the recipe's eps of 1e-6. Here eps is 1e-3:
  noise far below it moves nothing, while a weight or moment carried over wrongly still moves
  the parameters by ~1e-3.

Each uninterrupted run also writes the checkpoint (its tag after step RESUME_AT) that the other
world size resumes in a copy of the run directory; the copy's later tags, written by the old
number of ranks, are replaced as the resumed run reaches them."""
import hashlib
import shutil

import pytest

from dist_utils import run_ranks
from launch_utils import SYNTHETIC, TINY

STEPS, RESUME_AT = 3, 1
# Global batch 16 of 64 samples, chunks of 4 rows: 4, 2 and 1 chunks per step on 1, 2 and 4 ranks.
SETTINGS = SYNTHETIC + ["precision.dtype=fp32", "optimizer.eps=1e-3", f"schedule.steps={STEPS}",
                        "checkpoint.every=1", f"checkpoint.keep={STEPS}"]
# (ZeRO stage, the world size that writes, the world size that resumes).
CASES = [(0, 1, 2), (1, 2, 1), (2, 1, 2), (3, 2, 4)]
HOSTILE = (1, 2, 1)  # its checkpoint, with a pickle that runs code, is also resumed: refused
# An NVMe path that exists: the recipe refuses a missing one at load, before the resume's check.
NVME = "zero.overrides={offload_optimizer: {device: nvme, nvme_path: /tmp}}"


def _recipe(run_dir, stage, extra=()):
    from infcl_ds.config import load_recipe
    return load_recipe(TINY, SETTINGS + [f"zero.stage={stage}", f"output_dir={run_dir}"] + list(extra))


def _state_digests(engine):
    """{name: SHA-256 of the module's whole weight, the fp32 master, exp_avg and exp_avg_sq}, the Adam steps and each
    optimizer group's settings; every rank calls it (the ZeRO gathers are collectives)."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    def digest(*tensors):
        return hashlib.sha256(b"".join(t.detach().float().cpu().contiguous().numpy().tobytes()
                                       for t in tensors)).hexdigest()

    import deepspeed
    out, steps = {}, set()
    if engine.zero_optimization_stage() in (1, 2):
        # Links each parameter to its slice of the flat Adam states; DeepSpeed does it once,
        # before the first step, when the states do not exist yet.
        engine.optimizer._hp_optimizer_states_linked = False
        engine.optimizer._lazy_init_hp_params_optimizer_state()
    for name, param in engine.module.named_parameters():
        # The module's own (whole) weight, which the forward uses, and the optimizer's states.
        with deepspeed.zero.GatheredParameters([param], enabled=engine.zero_optimization_stage() == 3):
            weight = param.detach().clone()
        if engine.zero_optimization_stage() == 0:  # torch's AdamW itself: fp32 weights are the master
            state = engine.optimizer.state[param]
            out[name] = digest(weight, state["exp_avg"], state["exp_avg_sq"])
            steps.add(int(state["step"]))
        else:
            out[name] = digest(weight, safe_get_full_fp32_param(param), safe_get_full_optimizer_state(param, "exp_avg"),
                               safe_get_full_optimizer_state(param, "exp_avg_sq"))
    torch_optimizer = engine.optimizer if engine.zero_optimization_stage() == 0 else engine.optimizer.optimizer
    if engine.zero_optimization_stage() > 0:
        steps = {int(s["step"]) for s in torch_optimizer.state.values()}
    # Each group's settings (weight decay, betas, eps, rate).
    groups = [{k: v for k, v in g.items() if k != "params"} for g in torch_optimizer.param_groups]
    return out, sorted(steps), groups


class _Marker:
    """Unpickled by a full unpickler, creates the file ``path`` (any code could run instead)."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "w")


def _plant(path, marker):
    """Add the marker's pickle to a checkpoint file and re-sign its tag's manifest."""
    import torch

    from infcl_ds.checkpoint.manifest import read_manifest, write_manifest
    state = torch.load(path, map_location="cpu", weights_only=False)
    state["payload"] = _Marker(marker)
    torch.save(state, path)
    write_manifest(path.parent, read_manifest(path.parent)["recipe_sha256"])


def _record_samples(log):
    """Every (epoch, index) the sampler hands the data loader, in order, appended to ``log``."""
    import infcl_ds.data.train_stream as train

    def recording(*args, **kwargs):
        for piece in original(*args, **kwargs):
            log.extend(piece)
            yield piece

    original = train.rank_batches
    train.rank_batches = recording
    return lambda: setattr(train, "rank_batches", original)


def _train(rank, world, jobs):
    """Each job (run_dir, stage, tag to resume or None) trains to STEPS. Per job: the samples
    this rank's steps took, the engine's state digests after step RESUME_AT (a fresh run) or
    right after loading (a resume), and what rank 0 printed on stderr."""
    import contextlib
    import io

    from infcl_ds.checkpoint import store
    from infcl_ds.checkpoint.safe_load import CheckpointError
    from infcl_ds.training.trainer import Trainer
    out = []
    for run_dir, stage, tag, *extra in jobs:
        if extra:  # a ZeRO-1 resume that must be refused, with these recipe overrides: what it raised
            try:
                Trainer(_recipe(run_dir, 1, extra[0]), resume=tag)
                out.append("resumed")
            except CheckpointError as err:
                out.append(str(err))
            continue
        samples, err, states = [], io.StringIO(), {}
        restore = _record_samples(samples)
        save = store.save

        def save_and_record(engine, checkpoint_dir, step, *args, **kwargs):
            if step == RESUME_AT:
                states["digests"] = _state_digests(engine)
            return save(engine, checkpoint_dir, step, *args, **kwargs)

        store.save = save_and_record
        try:
            with contextlib.redirect_stderr(err):
                trainer = Trainer(_recipe(run_dir, stage), resume=tag)
                start = trainer.step
                if tag:
                    states["digests"] = _state_digests(trainer.engine.deepspeed)
                trainer.run()
        finally:
            store.save = save
            restore()
        # The batch assembled ahead of the last step was never trained on.
        out.append((samples[:(STEPS - start) * trainer.recipe.local_batch(world)], states["digests"],
                    err.getvalue() if rank == 0 else ""))
    return out


def _by_job(results, world):
    """{rank: [per job]} -> per job: ([samples of rank 0, of rank 1, ...], digests, rank 0's log)
    (what a refused resume raised on rank 0)."""
    return [results[0][job] if isinstance(results[0][job], str) else
            ([results[r][job][0] for r in range(world)], results[0][job][1], results[0][job][2])
            for job in range(len(results[0]))]


def _global_batches(ranks, steps):
    """The ranks' samples over `steps` steps -> the global batches, ranks' rows in rank order."""
    local = len(ranks[0]) // steps
    return [sum((r[s * local:(s + 1) * local] for r in ranks), []) for s in range(steps)]


def _params(run_dir):
    from infcl_ds.export import load_state_dict_from_checkpoint
    return load_state_dict_from_checkpoint(run_dir)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{case: (uninterrupted run dir, resumed run dir, its job, the resume's job)}, and what two
    2 -> 1 resumes of ZeRO-1 raised: one with a hostile pickle in rank 1's optimizer states, one
    with the optimizer states offloaded to NVMe."""
    base = tmp_path_factory.mktemp("worlds")
    dirs = {case: (base / "z{}-{}to{}-whole".format(*case), base / "z{}-{}to{}-resumed".format(*case))
            for case in CASES}
    whole, resumed = {}, {}

    def spawn(world):
        """One set of ranks: the resumes due on this world size, then the fresh runs."""
        resumes = [c for c in CASES if c[2] == world and c[1] in done and c not in resumed]
        fresh = [c for c in CASES if c[1] == world and c not in whole]
        tag = f"step_{RESUME_AT:08d}"
        jobs = [(str(dirs[c][1]), c[0], tag) for c in resumes] + [(str(dirs[c][0]), c[0], None) for c in fresh]
        if world == 1:  # first, two refused resumes of the ZeRO-1 run of 2 ranks
            jobs[:0] = [(str(hostile), 1, tag, []), (str(dirs[HOSTILE][1]), 1, tag, [NVME])]
        results = _by_job(run_ranks(_train, world, jobs, wait_s=600), world)
        if world == 1:
            refused.extend(results[:2])
            results = results[2:]
        for case, result in zip(resumes + fresh, results):
            (resumed if case in resumes else whole)[case] = result
        for case in fresh:  # resumed from its tag of step RESUME_AT; the later tags are rewritten
            shutil.copytree(dirs[case][0], dirs[case][1])
        if world == 2 and not refused:
            shutil.copytree(dirs[HOSTILE][0], hostile)
            _plant(hostile / "checkpoints" / tag / "zero_pp_rank_1_mp_rank_00_optim_states.pt", marker)
        done.add(world)

    done, refused = set(), []
    hostile, marker = base / "hostile", base / "pwned"
    for world in (2, 1, 2, 4):  # each resume after the run that writes its checkpoint
        spawn(world)
    return {case: (*dirs[case], whole[case], resumed[case]) for case in CASES}, (*refused, marker)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "zero{}-{}to{}".format(*c))
def test_resume_on_another_world_size_continues_exactly(runs, case):
    stage, before, after = case
    whole_dir, resumed_dir, (whole_samples, saved, _), (samples, loaded, log) = runs[0][case]
    assert loaded == saved  # weights, moments, step and rate carried over bit for bit
    assert _global_batches(samples, STEPS - RESUME_AT) == _global_batches(whole_samples, STEPS)[RESUME_AT:]
    lines = [line for line in log.splitlines() if "written by" in line]
    how = "re-partitioned through DeepSpeed's universal checkpoint" if stage else "loaded whole (ZeRO 0)"
    assert lines == [f"infcl-ds train: resuming step_{RESUME_AT:08d} written by {before} rank{'s' * (before > 1)} "
                     f"on {after} rank{'s' * (after > 1)}: ZeRO-{stage} states {how}; data continues at epoch 0 "
                     f"step {RESUME_AT}; RNG streams re-derived per rank"], log[-3000:]
    checkpoints = resumed_dir / "checkpoints"
    assert not (checkpoints / ".universal").exists()
    # The tags written after the resume hold this world's files only (the old ones were removed).
    assert sorted(p.name for p in (checkpoints / f"step_{STEPS:08d}").glob("client_rank*")) == [
        f"client_rank{r}.pt" for r in range(after)]
    want, got = _params(whole_dir), _params(resumed_dir)
    assert want.keys() == got.keys()
    largest = max(w.double().abs().max().item() for w in want.values())
    for name in want:
        err = (got[name].double() - want[name].double()).abs().max().item() / largest
        assert err < 1e-6, (name, err)


def test_the_reshaping_reads_no_file_that_runs_code(runs):
    # DeepSpeed's converter reads every writing rank's optimizer states: through the
    # weights-only reader, like a resume on the same number of ranks.
    message, _, marker = runs[1]
    assert "could not be re-partitioned for 1 rank:" in message and "zero_pp_rank_1" in message, message
    assert "refused" in message and "--trust-checkpoint" in message, message
    assert not marker.exists()


def test_what_cannot_be_reshaped_is_one_line_before_the_engine(runs):
    # NVMe offload: DeepSpeed swaps optimizer states per rank. Refused from the config alone,
    # alike on every rank, before the model or engine is built.
    _, message, _ = runs[1]
    assert message == ("cannot resume step_00000001, written by 2 ranks, on 1 rank: zero_optimization.offload_optimizer "
                       "on NVMe: DeepSpeed restores swapped optimizer states only on the number of ranks that wrote "
                       "them; resume it on 2 ranks"), message
