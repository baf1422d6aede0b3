"""`infcl-ds plan`: check a recipe against the GPUs it will run on, before launching it.

    infcl-ds plan --config RECIPE [--gpus N | --hostfile F [--include S] [--exclude S]
                  [--num_nodes N] [--num_gpus N]] [--gpu-memory 80GiB] [--host-memory 2TiB] [--cores N]
                  [--set k=v ...]
    infcl-ds plan --scaling [--batch 4M,12M] [--dim 768]

Exit status: 0 the recipe fits, 1 it does not (the verdict says why and what would), 2 it is
refused (invalid recipe or flag, a batch that does not split over the GPUs, an unsupported
model, a GPU JPEG library this GPU node lacks).
The world comes from --gpus, else from the hostfile as DeepSpeed's launcher reads it (same
--include/--exclude/--num_nodes/--num_gpus), else from --num_gpus, else from a recipe file
named like `*-32gpu.yaml`. GPU and host memory and the cores of a node (for
`data.decode_workers: auto`) come from the flags, else from this node where it has a GPU
(plan/machine.py), else are assumed; the report says which. With DS_ACCELERATOR=cpu the ranks
run on their CPUs, as the trainer's do: the plan is for CPU ranks, with this node's memory and
cores.
"""
import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Tuple

from ..cli_args import ArgumentParser, positive_number, whole_number, whole_number_in
from ..config import Recipe, RecipeError, load_recipe
from ..config.recipe import MAX_SAMPLES
from ..data import DataError
from ..data.decoding.nvimgcodec_decode import nvimgcodec_module
from ..data.footprint import gpu_decode_share
from .refusal import PlanError
from .machine import Node, ranks_on_cpu, read_node
from .machine import parse_size as machine_parse_size
from .plan import DEFAULT_HOST_MEMORY, MAX_GPUS, make_plan
from .auto_values import ASSUMED_CORES_PER_GPU
from .report import render_plan, render_scaling
from .timing import DEFAULT_ENCODER_TFLOPS, DEFAULT_NETWORK, NETWORKS, KernelRates, ring_scaling_table

# An 80 GB H100/A100-class GPU when --gpu-memory is not given.
ASSUMED_GPU_MEMORY = 80 << 30
# The most CPUs Linux runs on (CONFIG_NR_CPUS's upper end): --cores beyond is no node's.
MAX_CORES = 8192
# --dim: the widest embedding a plan is drawn for (the shipped models' are 512 to 1024).
MAX_DIM = 1 << 16

# Rank counts: one for each rank of the job, at most the planner's MAX_GPUS.
rank_count = whole_number_in(1, MAX_GPUS)


def launch_count(text: str) -> int:
    """--num_nodes, --num_gpus as DeepSpeed's launcher takes them: -1 (all of the hostfile's),
    else 1 to MAX_GPUS."""
    value = whole_number(text)
    if value != -1 and not 1 <= value <= MAX_GPUS:
        raise argparse.ArgumentTypeError(f"must be -1 (all) or 1 to {MAX_GPUS}, got {value}")
    return value


def rank_counts(text: str) -> List[int]:
    """'8,16,32' -> [8, 16, 32], each a rank_count."""
    return [rank_count(part) for part in text.split(",")]


def parse_size(text: str) -> int:
    """machine.parse_size for argparse: '80GiB' -> 85899345920."""
    try:
        return machine_parse_size(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def parse_count(text: str) -> int:
    """'4M' -> 4194304, '256k' -> 262144, '1000' -> 1000 (powers of two, as the benchmarks);
    a global batch, so 1 to the recipe's largest (MAX_SAMPLES)."""
    match = re.fullmatch(r"\s*([0-9]+)\s*([kKmM]?)\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a count: {text!r} (e.g. 4M, 256k, 1000)")
    value = int(match.group(1)) * {"": 1, "k": 1 << 10, "m": 1 << 20}[match.group(2).lower()]
    if not 1 <= value <= MAX_SAMPLES:
        raise argparse.ArgumentTypeError(f"each batch must be 1 to {MAX_SAMPLES} ({MAX_SAMPLES >> 20}M), "
                                         f"got {text.strip()!r}")
    return value


def parse_counts(text: str) -> List[int]:
    """'4M,12M' -> [4194304, 12582912]."""
    return [parse_count(part) for part in text.split(",")]


def hostfile_world(hostfile: str, include: str, exclude: str, num_nodes: int, num_gpus: int) -> Tuple[int, int]:
    """(ranks, ranks per node) of a launch, resolved by DeepSpeed's own launcher code."""
    from deepspeed.launcher.runner import apply_num_nodes_and_gpus, fetch_hostfile, parse_inclusion_exclusion
    try:
        pool = fetch_hostfile(hostfile)
        if not pool:
            raise ValueError("no such file")
        active = apply_num_nodes_and_gpus(parse_inclusion_exclusion(pool, include, exclude), num_nodes, num_gpus)
    except ValueError as err:  # DeepSpeed's own messages: bad entries, unknown hosts in --include
        raise PlanError(f"plan: hostfile {hostfile}: {err}") from err
    slots = [len(s) for s in active.values()]
    return sum(slots), max(slots)


def _world(args) -> Tuple[int, Optional[int]]:
    """(gpus, gpus per node from the hostfile or None)."""
    if args.gpus:
        return args.gpus, None
    if args.hostfile:
        return hostfile_world(args.hostfile, args.include, args.exclude, args.num_nodes, args.num_gpus)
    if args.num_gpus > 0:
        return args.num_gpus, None
    named = re.search(r"-(\d+)gpus?$", Path(args.config).stem)
    if named:
        return int(named.group(1)), None
    raise PlanError("plan: say how many GPUs: --gpus N, --hostfile F or --num_gpus N")


@dataclass(frozen=True)
class Sizes:
    """The GPU and host memory a plan is made for, each with where it came from (a note for the
    report; empty when a flag gave it)."""
    gpu_bytes: int
    gpu_note: str
    host_bytes: int
    host_note: str


def memory_sizes(gpu_flag: Optional[int], host_flag: Optional[int], node: Optional[Node] = None,
                 on_cpu: bool = False) -> Sizes:
    """Flags first; else this node's sizes where it has a GPU (it is a training node); else
    assumed sizes, said to be. CPU ranks (``on_cpu``): no GPU memory (0), this node's host
    memory (its ranks run on CPUs like it). ``node`` is read only when a flag is missing."""
    if node is None and (host_flag is None or (gpu_flag is None and not on_cpu)):
        node = read_node()
    if on_cpu:
        if gpu_flag is not None:
            raise PlanError("plan: --gpu-memory: DS_ACCELERATOR=cpu runs the ranks on their CPUs, which have no GPU "
                            "memory (unset DS_ACCELERATOR to plan for GPUs)")
        return Sizes(0, "", *((host_flag, "") if host_flag is not None else
                              (node.host_memory_bytes, f"read from this node's {node.host_memory_source}")))
    if gpu_flag is not None:
        gpu = (gpu_flag, "")
    elif node.has_gpus:
        gpu = (node.gpu_memory_bytes, f"read from this node: {node.gpu_text()}")
    else:
        gpu = (ASSUMED_GPU_MEMORY, f"assumed {ASSUMED_GPU_MEMORY // 2**30} GiB GPUs: this node has none; "
                                   "pass --gpu-memory")
    if host_flag is not None:
        host = (host_flag, "")
    elif node.has_gpus:
        host = (node.host_memory_bytes, f"read from this node's {node.host_memory_source}")
    else:
        host = (DEFAULT_HOST_MEMORY, "assumed: this node has no GPU; pass --host-memory")
    return Sizes(*gpu, *host)


def node_cores(flag: Optional[int], node: Optional[Node] = None, on_cpu: bool = False) -> Tuple[Optional[int], str]:
    """(usable cores per node, where they came from) as memory_sizes: the flag; else this node's
    where it has a GPU or the ranks run on CPUs (``on_cpu``); else None, which make_plan takes
    as ASSUMED_CORES_PER_GPU per GPU, said to be assumed."""
    if flag is not None:
        return flag, ""
    node = node or read_node()
    if node.has_gpus or on_cpu:
        return node.cores, "read from this node"
    return None, f"assumed {ASSUMED_CORES_PER_GPU} cores per GPU: this node has no GPU; pass --cores"


def _parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="infcl-ds plan", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", help="recipe YAML")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="recipe override, as for training (repeatable)")
    p.add_argument("--gpus", type=rank_count, default=0,
                   help=f"data-parallel ranks, 1 to {MAX_GPUS} (default: from the hostfile, else --num_gpus, else "
                        "the recipe's name, e.g. *-32gpu.yaml)")
    p.add_argument("--gpus-per-node", type=rank_count, default=8,
                   help="ranks on each node with --gpus, and for the scaling table (default: 8; a hostfile gives "
                        "its own)")
    p.add_argument("--gpu-memory", type=parse_size, default=None,
                   help="per GPU (default: read from this node's GPUs; without one "
                        f"{ASSUMED_GPU_MEMORY // 2**30} GiB, said to be assumed)")
    p.add_argument("--host-memory", type=parse_size, default=None,
                   help="per node (default: read from this node where it has a GPU or DS_ACCELERATOR=cpu, its "
                        "cgroup limit if lower; else 2TiB, said to be assumed)")
    p.add_argument("--cores", type=whole_number_in(1, MAX_CORES), default=None,
                   help=f"usable cores per node, 1 to {MAX_CORES}, for data.decode_workers: auto (default: read from "
                        "this node where it has a GPU or DS_ACCELERATOR=cpu, its affinity and CPU quota; else "
                        f"{ASSUMED_CORES_PER_GPU} per GPU, said to be assumed)")
    p.add_argument("--network", choices=list(NETWORKS), default=DEFAULT_NETWORK, help="link between nodes")
    p.add_argument("--encoder-tflops", type=positive_number, default=None,
                   help="effective encoder rate per GPU, bf16, for every model (default: the model's measured "
                        f"rates if any, else {DEFAULT_ENCODER_TFLOPS:g}, ViT-B-16's measured rate)")
    p.add_argument("--max-step-time", type=positive_number, default=None, metavar="SECONDS",
                   help="a step-time budget, weighed as a third limit")
    p.add_argument("--rates", default=None, help="loss.json of `infcl-ds bench loss` (default: docs/benchmarks)")
    launcher = p.add_argument_group("the launch (as DeepSpeed's launcher reads it)")
    launcher.add_argument("--hostfile", help="DeepSpeed hostfile: one 'host slots=N' line per node")
    launcher.add_argument("--include", default="",
                          help="hosts and slots of the hostfile to use, e.g. 'node1@node2:0,1'")
    launcher.add_argument("--exclude", default="", help="hosts and slots of the hostfile to leave out")
    launcher.add_argument("--num_nodes", type=launch_count, default=-1,
                          help="the first N nodes of the hostfile (default -1: all)")
    launcher.add_argument("--num_gpus", type=launch_count, default=-1,
                          help="ranks per node of the hostfile; without one, the ranks (default -1: all slots)")
    scaling = p.add_argument_group("ring scaling table (docs/planner.md)")
    scaling.add_argument("--scaling", action="store_true", help="print the table instead of a plan")
    scaling.add_argument("--batch", type=parse_counts, default="4M,12M",
                         help="global batches, comma-separated (e.g. 4M,12M, 256k)")
    scaling.add_argument("--dim", type=whole_number_in(1, MAX_DIM), default=768,
                         help=f"embedding dimension D, 1 to {MAX_DIM} (default 768: ViT-L-14's)")
    scaling.add_argument("--ranks", type=rank_counts, default="8,16,32,64,128,256,512,1024",
                         help=f"rank counts, comma-separated, each 1 to {MAX_GPUS}")
    return p


def _rates(path: Optional[str]) -> KernelRates:
    """--rates, or the shipped loss rates; a file that is not one is a PlanError naming it."""
    try:
        return KernelRates.load(path or None)
    except (OSError, ValueError, KeyError, TypeError) as err:  # JSONDecodeError is a ValueError
        raise PlanError(f"plan: --rates {path}: not a loss.json written by `infcl-ds bench loss` "
                        f"({type(err).__name__}: {str(err)[:120]})") from None


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        rates = _rates(args.rates)
        if args.scaling:
            if max(args.ranks) > min(args.batch):
                raise PlanError(f"plan: --ranks {max(args.ranks)} is more than --batch {min(args.batch)}: each rank "
                                "needs a sample")
            rows = ring_scaling_table(args.batch, args.dim, args.ranks, args.gpus_per_node, rates=rates)
            print(render_scaling(rows, rates, args.dim))
            return 0
        if not args.config:
            raise PlanError("plan: --config RECIPE is required (or --scaling)")
        recipe = load_recipe(args.config, args.overrides)
        gpus, per_node = _world(args)
        on_cpu = ranks_on_cpu()
        if on_cpu and args.encoder_tflops is not None:
            raise PlanError("plan: --encoder-tflops: the step time of CPU ranks (DS_ACCELERATOR=cpu) is not modelled")
        node = read_node() if None in (args.gpu_memory, args.host_memory, args.cores) else None
        sizes = memory_sizes(args.gpu_memory, args.host_memory, node, on_cpu)
        cores, cores_note = node_cores(args.cores, node, on_cpu)
        plan = make_plan(recipe, gpus, sizes.gpu_bytes, per_node or args.gpus_per_node, sizes.host_bytes,
                         cores=cores, encoder_tflops=args.encoder_tflops, network=args.network,
                         max_step_s=args.max_step_time, rates=rates)
        missing = missing_gpu_jpeg_library(plan.recipe)
        if missing and (node or read_node()).has_gpus:  # this node trains: its ranks would refuse to start
            raise PlanError(f"plan: {missing}")
    except (RecipeError, PlanError) as err:
        print(f"refused: {err}", file=sys.stderr)
        return 2
    # A node without a GPU plans for others: they need the library, this one does not.
    notes = [f"{missing}; on this node, which plans for GPU nodes: they need it"] if missing else []
    print(render_plan(plan, gpu_memory_note=sizes.gpu_note, host_memory_note=sizes.host_note, cores_note=cores_note,
                      notes=notes))
    return 0 if plan.fits else 1


def missing_gpu_jpeg_library(recipe: Recipe) -> str:
    """Where the GPU decodes JPEGs through nvImageCodec (data.gpu_jpeg_library=nvimgcodec, the
    decoder resolved) and it cannot be imported here: the data path's own line naming the extra
    that installs it (data/decoding/nvimgcodec_decode.py); else ""."""
    data = recipe.data
    if data.gpu_jpeg_library != "nvimgcodec" or not gpu_decode_share(data):
        return ""
    try:
        nvimgcodec_module()
    except DataError as err:
        return str(err)
    return ""


if __name__ == "__main__":
    sys.exit(main())
