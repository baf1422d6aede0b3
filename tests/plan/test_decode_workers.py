"""`data.decode_workers: auto` (the default): the cores of this rank's share of its node, less
what else keeps them busy (plan/auto_values.py's auto_decode_workers), resolved per rank at start-up
(training/resolve.py) from what the node says (plan/machine.py: affinity, CPU quota, the
launcher's ranks per node), and said by the planner with its reason."""
import os

import pytest
import torch

from infcl_ds.config import RecipeError, dump_recipe, load_recipe
from infcl_ds.config.recipe import MAX_PROCESSES, DataSection
from infcl_ds.data import DataError, build_train_data
from infcl_ds.plan import machine
from infcl_ds.plan.command import main as plan_main
from infcl_ds.plan.plan import make_plan
from infcl_ds.plan.auto_values import auto_decode_workers
from infcl_ds.training.recipe_change import trajectory_changes
from infcl_ds.training.resolve import agree_on_chunk, resolve_recipe

GIB = 1 << 30
TINY = "ds_configs/recipes/tiny-cpu.yaml"


@pytest.fixture
def node(monkeypatch):
    """A node as the rank sees it: its affinity, its launcher's, and the launcher's ranks per node.
    node(cores, launcher=None, ranks=None): launcher None has the rank's own affinity."""
    for name in machine._LOCAL_RANKS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(machine, "_cgroup_cores", lambda: None)

    def set_node(cores, launcher=None, ranks=None, quota=None):
        mine, parent = set(range(cores)), set(range(launcher or cores))
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: parent if pid == os.getppid() else mine)
        monkeypatch.setattr(machine, "_cgroup_cores", lambda: quota)
        if ranks is not None:
            monkeypatch.setenv("LOCAL_WORLD_SIZE", str(ranks))
    return set_node


def chosen(workers=2, decoder="pil", default_ranks=1):
    data = DataSection(workers=workers, decoder=decoder)
    return auto_decode_workers(data, machine.rank_cores(default_ranks))


# -- the rule ---------------------------------------------------------------------------------

def test_one_rank_with_16_cores_keeps_all_but_the_training_process_and_its_readers(node):
    node(16)
    one = chosen(workers=1)
    assert (one.count, one.why) == (14, "16 cores of this rank's share, less the training process and 1 reader "
                                        "(one core)")
    # the readers together one core: they read and tokenize a batch a step, a small load
    assert chosen(workers=2).count == 14 and chosen(workers=6).count == 14 and chosen(workers=0).count == 15
    # The GPU decoder's lane thread takes a core too; nvjpeg and decoded batches start no processes.
    hybrid = chosen(workers=2, decoder="hybrid")
    assert hybrid.count == 13 and hybrid.why.endswith("2 readers (one core) and the GPU decoder's lane thread")
    assert chosen(decoder="nvjpeg").count == 0
    assert auto_decode_workers(DataSection(host_batch="decoded"), machine.rank_cores()).count == 0


def test_eight_ranks_split_their_node(node, monkeypatch):
    """128 cores shared by 8 ranks (no binding): 16 each, not 128 each."""
    node(128, ranks=8)
    eight = chosen(workers=2)
    assert (eight.count, eight.why) == (14, "16 cores of this rank's share, 128 usable on this node / 8 ranks, less "
                                            "the training process and 2 readers (one core)")
    # The deepspeed launcher says LOCAL_SIZE; where no launcher says, one rank per visible GPU.
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    monkeypatch.setenv("LOCAL_SIZE", "4")
    assert chosen().count == 32 - 2
    monkeypatch.delenv("LOCAL_SIZE")
    assert chosen(default_ranks=8).count == 14


def test_a_rank_bound_by_its_launcher_keeps_its_own_cores_and_a_narrowed_launch_is_split(node):
    # deepspeed --bind_cores_to_rank / mpirun --bind-to core: 16 of the launcher's 128, this rank's alone.
    node(16, launcher=128, ranks=8)
    bound = chosen()
    assert bound.count == 14 and bound.why.startswith("16 cores of this rank's share, bound to it by its launcher")
    # `taskset -c 0-7` (or a scheduler's cpuset) around the whole launch: the 8 ranks share 8 cores.
    node(8, launcher=8, ranks=8)
    assert chosen().count == 0
    # ... and around a single rank: 8 for it, not os.cpu_count().
    node(8, launcher=os.cpu_count() + 64, ranks=1)
    assert chosen().count == 6
    # A CPU quota (a container's --cpus) bounds the cores whatever the affinity.
    node(128, ranks=1, quota=8)
    assert chosen().count == 6


def test_a_one_core_share_decodes_in_the_training_process_and_two_cores_keep_one_process(node):
    node(1)
    single = chosen()
    assert single.count == 0 and single.why.startswith("1 core of this rank's share: decoded in the training process")
    node(2)
    two = chosen(workers=2)  # 2 - 1 - 1 < 1: still one process, so that decoding overlaps the step
    assert two.count == 1 and two.why.endswith("at least 1, so that decoding overlaps the step")
    node(4 * MAX_PROCESSES)
    assert chosen().count == MAX_PROCESSES


def test_node_readers(tmp_path, monkeypatch):
    """The CPU quota in whole cores (v2 'quota period', v1 beside its period), and the launcher's
    ranks per node (srun writes '8(x4)')."""
    v2, v1 = tmp_path / "cpu.max", tmp_path / "cpu.cfs_quota_us"
    for text, cores in (("max 100000\n", None), ("800000 100000\n", 8), ("150000 100000\n", 2)):
        v2.write_text(text)
        assert machine._cgroup_cores([str(v2)]) == cores
    v1.write_text("-1\n")
    (tmp_path / "cpu.cfs_period_us").write_text("100000\n")
    assert machine._cgroup_cores([str(v1)]) is None
    v1.write_text("400000\n")
    assert machine._cgroup_cores([str(tmp_path / "absent"), str(v1)]) == 4
    for name in machine._LOCAL_RANKS:
        monkeypatch.delenv(name, raising=False)
    assert machine.local_ranks(3) == 3
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "8(x4)")
    assert machine.local_ranks() == 8


# -- the recipe ---------------------------------------------------------------------------------

def test_the_recipe_default_is_auto_and_numbers_still_work():
    assert load_recipe(None).data.decode_workers == "auto"
    assert load_recipe(None, ["data.decode_workers=3"]).data.decode_workers == 3
    assert load_recipe(None, ["data.decode_workers=0"]).data.decode_workers == 0
    with pytest.raises(RecipeError, match=r"^recipe: data.decode_workers must be auto or an integer from 0 to 1,024, "
                                          r"got 'many'$"):
        load_recipe(None, ["data.decode_workers=many"])
    # It never changes the trajectory: a resume may resolve auto to another count.
    saved, now = load_recipe(None, ["data.decode_workers=14"]), load_recipe(None)
    assert trajectory_changes(dump_recipe(saved), dump_recipe(now)) == []


# -- the planner --------------------------------------------------------------------------------

PIL = ["--set", "data.decoder=pil"]  # the tiny model's steps are too short for PIL: auto would add the GPU


def test_the_plan_says_what_auto_becomes_and_why(capsys, monkeypatch):
    from test_plan_machine import CPU_NODE, H200_NODE
    monkeypatch.setattr("infcl_ds.plan.command.read_node", lambda: CPU_NODE)
    assert plan_main(["--config", TINY, "--gpus", "8", "--cores", "128", "--set", "batch.chunk=64", *PIL]) == 0
    out = capsys.readouterr().out
    assert ("data.decode_workers=14 (16 cores of each rank's share, 128 on a node / 8 ranks, less "
            "the training process and 1 reader (one core))") in out
    assert "/s from 14 decode processes" in out  # the decoding line counts the resolved number
    assert plan_main(["--config", TINY, "--gpus", "2", *PIL]) == 0  # no GPU here: assumed, and said
    assert ("data.decode_workers=14 (16 cores of each rank's share, 32 on a node / 2 ranks, less the "
            "training process and 1 reader (one core); assumed 16 cores per GPU: this node has no GPU; pass --cores)"
            ) in capsys.readouterr().out
    monkeypatch.setattr("infcl_ds.plan.command.read_node", lambda: H200_NODE)
    assert plan_main(["--config", TINY, "--gpus", "2", *PIL]) == 0
    assert ("data.decode_workers=14 (16 cores of each rank's share, 32 on a node / 2 ranks, less the "
            "training process and 1 reader (one core); read from this node)") in capsys.readouterr().out
    assert plan_main(["--config", TINY, "--gpus", "2", "--set", "data.decode_workers=3", *PIL]) == 0
    out = capsys.readouterr().out
    assert "data.decode_workers=" not in out and "/s from 3 decode processes" in out
    # make_plan without cores: the same assumption, marked.
    plan = make_plan(load_recipe(TINY, ["data.decoder=pil"]), 2, 80 * GIB)
    assert plan.recipe.data.decode_workers == plan.choice("data.decode_workers").value == 14 and plan.cores_assumed


# -- start-up -----------------------------------------------------------------------------------

def test_each_rank_resolves_it_at_start_up_and_its_data_starts_that_many(node, capsys):
    from open_clip.tokenizer import SimpleTokenizer
    node(3, ranks=1)
    recipe = load_recipe(None, ["data.workers=0", "batch.global=8", "batch.chunk=8", "data.synthetic_size=16",
                                "data.decoder=pil"])
    with pytest.raises(DataError, match="data.decode_workers=auto is resolved by the trainer"):
        build_train_data(recipe.data, rank=0, world_size=1, local_batch=8, seed=0, image_size=8,
                         tokenizer=SimpleTokenizer(context_length=8))
    resolution = resolve_recipe(recipe, 1, torch.device("cpu"), rank=0)
    agree_on_chunk(recipe, resolution, 1, torch.device("cpu"), rank=0)
    assert capsys.readouterr().err == ("auto: data.decode_workers=2 (3 cores of this rank's share, less the training "
                                       "process); data.keep_decoded_gib=1 (a CPU rank); data.keep_decoded_host_gib=0 "
                                       "(a CPU rank); data.decode_window_gib=1 (a CPU rank)\n")
    resolved = resolution.recipe
    assert resolved.data.decode_workers == 2 and recipe.data.decode_workers == "auto"  # the saved recipe keeps auto
    assert {c.key: c.value for c in resolution.choices} == {"data.decode_workers": 2, "data.keep_decoded_gib": 1.0,
                                                 "data.keep_decoded_host_gib": 0.0, "data.decode_window_gib": 1.0}
    agree_on_chunk(recipe, resolve_recipe(recipe, 1, torch.device("cpu"), rank=1), 1, torch.device("cpu"), rank=1)
    assert capsys.readouterr().err == ""  # said once, by rank 0
    data = build_train_data(resolved.data, rank=0, world_size=1, local_batch=8, seed=0, image_size=8,
                            tokenizer=SimpleTokenizer(context_length=8))
    try:
        assert len(data.decoder.pids) == 2
    finally:
        data.close()
