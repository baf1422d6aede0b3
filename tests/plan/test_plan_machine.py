"""The planner reads the node it runs on (plan/machine.py), and flags still win."""
import pytest

from infcl_ds.plan import machine
from infcl_ds.plan.command import ASSUMED_GPU_MEMORY, main, memory_sizes
from infcl_ds.plan.plan import DEFAULT_HOST_MEMORY

GIB = 1 << 30
H200_NODE = machine.Node(gpu_count=2, gpu_name="NVIDIA H200", gpu_memory_bytes=143771 << 20,
                         host_memory_bytes=256 * GIB, host_memory_source="MemTotal", cores=32)
CPU_NODE = machine.Node(gpu_count=0, gpu_name="", gpu_memory_bytes=0, host_memory_bytes=24 * GIB,
                        host_memory_source="MemTotal", cores=2)


def test_a_gpu_node_gives_its_own_sizes_and_says_so():
    sizes = memory_sizes(None, None, H200_NODE)
    assert (sizes.gpu_bytes, sizes.host_bytes) == (143771 << 20, 256 * GIB)
    assert sizes.gpu_note == "read from this node: 2 x NVIDIA H200, 140.4 GiB each"
    assert sizes.host_note == "read from this node's MemTotal"


def test_flags_win_over_the_node():
    sizes = memory_sizes(80 * GIB, 2048 * GIB, H200_NODE)
    assert (sizes.gpu_bytes, sizes.gpu_note, sizes.host_bytes, sizes.host_note) == (80 * GIB, "", 2048 * GIB, "")


def test_cpu_ranks_have_no_gpu_memory_and_this_nodes_host_and_cores():
    """DS_ACCELERATOR=cpu: the ranks run on CPUs like this node's, whether or not it has GPUs."""
    from infcl_ds.plan.command import node_cores
    for node in (CPU_NODE, H200_NODE):
        sizes = memory_sizes(None, None, node, on_cpu=True)
        assert (sizes.gpu_bytes, sizes.gpu_note, sizes.host_bytes) == (0, "", node.host_memory_bytes)
        assert sizes.host_note == "read from this node's MemTotal"
        assert node_cores(None, node, on_cpu=True) == (node.cores, "read from this node")
    assert node_cores(None, CPU_NODE)[0] is None  # planned for GPUs elsewhere: assumed


def test_a_node_without_gpus_is_no_training_node_so_sizes_are_assumed():
    sizes = memory_sizes(None, None, CPU_NODE)
    assert (sizes.gpu_bytes, sizes.host_bytes) == (ASSUMED_GPU_MEMORY, DEFAULT_HOST_MEMORY)
    assert "assumed" in sizes.gpu_note and "--gpu-memory" in sizes.gpu_note
    assert "assumed" in sizes.host_note and "--host-memory" in sizes.host_note


def test_host_memory_is_the_cgroup_limit_where_lower(tmp_path, monkeypatch):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       263856128 kB\nMemFree:        1 kB\n")
    assert machine._mem_total(meminfo) == 263856128 * 1024
    limit = tmp_path / "memory.max"
    for text, want in (("max\n", None), ("68719476736\n", 64 * GIB), (str(1 << 62), None)):
        limit.write_text(text)
        assert machine._cgroup_limit([str(limit)]) == want
    assert machine._cgroup_limit([str(tmp_path / "absent")]) is None
    monkeypatch.setattr(machine, "_cgroup_limit", lambda: 1 << 20)
    assert machine.host_memory() == (1 << 20, "cgroup limit")


def test_the_report_names_the_source(monkeypatch, capsys):
    monkeypatch.setattr("infcl_ds.plan.command.read_node", lambda: H200_NODE)
    assert main(["--config", "ds_configs/recipes/tiny-cpu.yaml", "--gpus", "2"]) == 0
    out = capsys.readouterr().out
    assert "(read from this node: 2 x NVIDIA H200, 140.4 GiB each)" in out
    assert "of 256.0 (read from this node's MemTotal)" in out


def test_the_node_memory_can_be_told_where_memtotal_is_not_it(monkeypatch):
    """INFCL_DS_HOST_MEMORY (launch/train.sh --host-memory sets it for every rank): a VM that grows
    its memory as it is used reads a fraction of it in MemTotal at the start."""
    monkeypatch.setenv(machine.HOST_MEMORY_ENV, "500GiB")
    assert machine.host_memory() == (500 * GIB, "INFCL_DS_HOST_MEMORY")
    monkeypatch.setenv(machine.HOST_MEMORY_ENV, "lots")
    with pytest.raises(ValueError, match=r"^INFCL_DS_HOST_MEMORY: not a size: 'lots'"):
        machine.host_memory()
    monkeypatch.delenv(machine.HOST_MEMORY_ENV)
    assert machine.host_memory()[1] in ("MemTotal", "cgroup limit")
