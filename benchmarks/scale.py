"""`python -m benchmarks.scale`: ViT-B-16 from JPEG shards through launch/train.sh on one GPU, two
GPUs and two DeepSpeed nodes of one GPU each on one host, each run against the planner's figures.

    python -m benchmarks.scale PART... [--out docs/benchmarks/scale.json] [--accelerator cuda|cpu]
        [--work /tmp/infcl-ds-scale] [--shards /tmp/infcl-ds-photos] [--set KEY=VALUE ...]
        [--host-memory SIZE]
    python -m benchmarks.scale --start PART... [options]        # a process session of its own
    OUT=DIR python -m benchmarks.scale --wait SECONDS [options]  # 0: it ended, 3: still running

Parts, run in the order given (a part's rows replace that part's rows in --out, the others kept):
  one-gpu-32k      GPU 0 alone (CUDA_VISIBLE_DEVICES=0, taskset to the first half of the cores),
                   global batch 32k, 3 steps: the per-GPU rate the scaling rows divide by
  two-gpu-1m       2 GPUs, global batch 1,048,576 (512k per GPU), 3 steps, then a resume of the
                   run for 1 more step
  one-node-64k     2 GPUs of one launcher, 64k, 3 steps
  two-nodes-64k    2 launchers from a hostfile of two nodes of one GPU each (--no_ssh --node_rank I
                   --master_addr 127.0.0.1, CUDA_VISIBLE_DEVICES=I, each on its half of the cores),
                   64k, 3 steps, the seed and shards of one-node-64k: the losses compared with its
                   row, the run directory with its run's
  resume-one-node  two-nodes-64k's run resumed by one launcher with 2 GPUs for 1 more step
  (and the four-GPU and ViT-B-32 parts of PARTS below, each with its comment)

Every run starts `launch/train.sh` (data check, planner, DeepSpeed's launcher) in a process
session of its own under --work. While it runs, every second: the host memory its processes
take (their proportional set size summed: a page shared between processes counted once, the
figure the planner's host model is compared with; also their resident sum and the machine's
memory in use above the start) and, on GPUs, each GPU's memory in use (nvidia-smi). Steps,
losses, decode wait and the peak allocated GPU memory (torch.cuda.max_memory_allocated of rank
0) come from the run's metrics.csv; a row's rates are the mean of the steps after the first
(compilation). The planner's figures come from make_plan in a child process (this process
never touches a GPU) with the sizes the planner reads off this node, as train.sh's planner does:
the peak allocated per GPU, the host memory per node (two nodes on one host: twice one node's),
the step time. A resume extends the schedule by its steps (`--allow-recipe-change`: the
saved run's recipe had fewer).

The checks each row carries (the targets): two-gpu-1m at least 2 steps after the first, decode
wait at most 5% of the step, samples/s at least 0.95 x twice one-gpu-32k's, host and GPU memory
within 10% of the planner's, the resume trained its step; two-nodes-64k the losses of
one-node-64k within LOSS_RTOL and each file of the run written by its one owner.

With --accelerator cpu every part runs on gloo ranks with the tiny model (infcl-tiny, fp32)
at batches of 32 (32k), 64 (64k) and 256 (1M) from small JPEG shards: the machinery, not the
figures.
"""
import argparse
import csv
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

# --wait's deadline counts from here, so that a wait ends within the command it was sized for:
# the imports below take torch's (4 s on an idle 2-core machine, longer on a host busy with a run).
STARTED = time.monotonic()

from .common import REPO, Job, cmdline, free_port, job_environment, session_pids, state_of, write_rows  # noqa: E402
from .proc_cpu import busiest_threads, children_cpu_s, thread_cpu_s  # noqa: E402

TRAIN_SH = REPO / "launch" / "train.sh"
GPU_RECIPE = REPO / "ds_configs" / "recipes" / "vit-b16-1m-8gpu.yaml"
CPU_RECIPE = REPO / "ds_configs" / "recipes" / "tiny-cpu.yaml"
GIB, MIB = 2 ** 30, 2 ** 20
# Two ranks summing the same numbers in the same order give the same loss; on GPUs bf16 kernels
# chosen or scheduled differently between two runs move it by about bf16's rounding.
LOSS_RTOL = {"cuda": 2e-3, "cpu": 1e-6}
PLAN_TOLERANCE = 0.10  # host and GPU memory within 10% of the planner's
# A run's shards hold this many global batches: its steps, a resume's step and the batch the
# data thread assembles ahead, none drawn twice in an epoch.
BATCHES_LISTED = 5


@dataclass(frozen=True)
class Part:
    name: str
    batch: int            # global batch on GPUs
    tiny_batch: int       # with --accelerator cpu
    gpus: int             # ranks
    nodes: int
    steps: int            # steps of the run (0: a resume only)
    resume_steps: int = 0
    resumes: str = ""     # the part whose run this one resumes
    one_gpu: bool = False  # GPU 0 and half the cores
    reference: str = ""   # the part whose samples/s per GPU this one's efficiency divides by
    targets: bool = False  # checked against the targets: efficiency, decode wait, planned step and host
    model: str = "ViT-B-16"  # on GPUs (CPU runs train the tiny model)
    sets: Tuple[str, ...] = ()  # the part's own recipe overrides on GPUs (its decoder, say)


REFERENCE = "one-gpu-32k"
PARTS = {p.name: p for p in (
    Part("one-gpu-32k", 32 * 1024, 32, 1, 1, 3, one_gpu=True),
    Part("two-gpu-1m", 1024 * 1024, 256, 2, 1, 3, resume_steps=1, reference=REFERENCE, targets=True),
    Part("one-node-64k", 64 * 1024, 64, 2, 1, 3, reference=REFERENCE),
    Part("two-nodes-64k", 64 * 1024, 64, 2, 2, 3, reference=REFERENCE),
    Part("resume-one-node", 64 * 1024, 64, 2, 1, 0, resume_steps=1, resumes="two-nodes-64k"),
    # four GPUs of one host: 32k a GPU (the reference), 256k a GPU, 512k a GPU (the paper's load),
    # and the 1M run's last checkpoint resumed on two GPUs
    Part("four-gpu-128k", 128 * 1024, 64, 4, 1, 3),
    Part("four-gpu-1m", 1024 * 1024, 256, 4, 1, 3, reference="four-gpu-128k", targets=True),
    Part("four-gpu-2m", 2048 * 1024, 512, 4, 1, 2, reference="four-gpu-128k"),
    Part("resume-two-gpu-1m", 1024 * 1024, 256, 2, 1, 0, resume_steps=1, resumes="four-gpu-1m"),
    # a small tower at the paper's per-GPU load: more images a second than a node's PIL processes
    # decode, so `auto` is to bring in the GPU's JPEG engines (nvImageCodec, the gpu-decode extra)
    Part("four-gpu-b32-2m", 2048 * 1024, 512, 4, 1, 3, model="ViT-B-32",
         sets=("data.decoder=auto", "data.gpu_jpeg_library=nvimgcodec")),
    # the same with the default library (torchvision), long enough for `auto`'s split to move to
    # the rates of steps 2-3 and for step 5, whose batch was assembled after the move, to show it
    Part("four-gpu-b32-2m-moving", 2048 * 1024, 512, 4, 1, 5, model="ViT-B-32", sets=("data.decoder=auto",)),
    # the same load per GPU on a two-GPU host: a rank's step as on four, a ring of two
    Part("two-gpu-b32-1m", 1024 * 1024, 256, 2, 1, 2, model="ViT-B-32",
         sets=("data.decoder=auto", "data.gpu_jpeg_library=nvimgcodec")),
    # one GPU with all its machine's cores, long enough for `auto`'s split to move to the rates of
    # steps 2-3 and for steps 5-7, whose batches were assembled after the move, to show it
    Part("one-gpu-b32-128k", 128 * 1024, 32, 1, 1, 7, model="ViT-B-32",
         sets=("data.decoder=auto", "data.gpu_jpeg_library=nvimgcodec")),
)}


@dataclass
class Setup:
    """What every part of one invocation shares."""
    accelerator: str
    work: Path
    shards: Path
    out: Path
    sets: List[str]       # --set: recipe overrides for every run, after the part's own
    host_memory: Optional[str] = None  # for the planner, where this node's own reading is wrong

    @property
    def cpu(self) -> bool:
        return self.accelerator == "cpu"


# -- shards ----------------------------------------------------------------------------------

def make_shards(setup: Setup, batch: int) -> str:
    """The photos shards (launch/bench_real_data.sh makes and lists them, once per machine), listed
    so that an epoch holds BATCHES_LISTED batches; the brace pattern of as many as that needs."""
    samples, shard_size = (128, 16) if setup.cpu else (16000, 2000)
    listed = math.ceil(batch * BATCHES_LISTED / shard_size)
    env = dict(job_environment(setup.accelerator), SHARDS=str(setup.shards), LISTED=str(listed),
               PHOTOS_SAMPLES=str(samples), PHOTOS_SHARD_SIZE=str(shard_size))
    subprocess.run(["bash", str(REPO / "launch" / "bench_real_data.sh"), "shards"], env=env, check=True)
    return f"{setup.shards}/listed/shard-{{00000..{listed - 1:05d}}}.tar"


# -- the recipe and the launch ---------------------------------------------------------------

def batch_of(part: Part, setup: Setup) -> int:
    return part.tiny_batch if setup.cpu else part.batch


def recipe_sets(part: Part, setup: Setup, shards: str, run_dir: Path, steps: int) -> List[str]:
    """The --set overrides of a part's run: same seed and shard list for every part of a batch."""
    sets = [f"batch.global={batch_of(part, setup)}", f"data.train={shards}", f"schedule.steps={steps}",
            "schedule.warmup_steps=1", "checkpoint.every=0", "checkpoint.keep=2", "logging.tensorboard=false",
            "logging.progress=false", "eval.every=0", f"output_dir={run_dir}"]
    if setup.cpu:  # the tiny model on the JPEG shards, at the scale of two cores
        local = batch_of(part, setup) // part.gpus
        return ["model.name=infcl-tiny", "data.source=webdataset", "data.eval=null", "data.workers=1",
                "data.decode_workers=1", f"batch.chunk={min(16, local)}"] + sets + setup.sets
    # the recipe with the part's model and settings, but the chunk, decode processes and pixels
    # kept on the GPU, which the planner and each rank choose for the GPU they find (auto)
    return ([f"model.name={part.model}", "batch.chunk=auto", "data.decode_workers=auto",
             "data.keep_decoded_gib=auto", *part.sets] + sets + setup.sets)


def recipe_of(setup: Setup) -> Path:
    return CPU_RECIPE if setup.cpu else GPU_RECIPE


def pinned(cores: str) -> List[str]:
    """The command prefix that runs a launcher (and so its ranks and workers) on ``cores``."""
    if shutil.which("taskset") is None:
        raise RuntimeError("taskset (util-linux) is needed to give a launcher half of the cores")
    return ["taskset", "-c", cores]


def core_halves() -> List[str]:
    """This process's cores in two halves, as taskset lists: one per GPU's node share."""
    cores = sorted(os.sched_getaffinity(0))
    half = max(1, len(cores) // 2)
    return [",".join(map(str, cores[:half])), ",".join(map(str, cores[half:] or cores[:half]))]


def sets_args(sets: List[str]) -> List[str]:
    return [a for s in sets for a in ("--set", s)]


def train_sh_resumes_with_changes() -> bool:
    """Whether launch/train.sh passes --allow-recipe-change on to the trainer."""
    return "--allow-recipe-change" in TRAIN_SH.read_text()


@dataclass
class Launch:
    """One launcher of a run: its command, environment and working directory."""
    command: List[str]
    env: Dict[str, str]
    cwd: Path
    log: Path


def launches(part: Part, setup: Setup, sets: List[str], part_dir: Path, port: int,
             resume: bool = False) -> List[Launch]:
    """A run's launchers: one train.sh, or one per node from a hostfile (--no_ssh)."""
    base = job_environment(setup.accelerator)
    base["PYTHONPATH"] = f"{REPO}{os.pathsep}{base['PYTHONPATH']}" if base.get("PYTHONPATH") else str(REPO)
    recipe = str(recipe_of(setup))
    tail = ["--master_port", str(port)] + sets_args(sets)
    tail += ["--host-memory", setup.host_memory] if setup.host_memory else []
    if resume:
        tail += ["--resume", "latest"]
        if not train_sh_resumes_with_changes():
            # train.sh does not pass the flag on: the command it would exec, without its checks
            command = ["deepspeed", "--num_gpus", str(part.gpus), "--master_port", str(port), "--module",
                       "infcl_ds.train", "--config", recipe] + sets_args(sets) + ["--resume", "latest",
                                                                                  "--allow-recipe-change"]
            return [Launch(command, base, part_dir / "node0", part_dir / "resume.log")]
        tail.append("--allow-recipe-change")
    if part.nodes == 1:
        env, prefix = dict(base), []
        if part.one_gpu:
            env["CUDA_VISIBLE_DEVICES"] = "0"
            prefix = pinned(core_halves()[0])
        log = part_dir / ("resume.log" if resume else "launch.log")
        return [Launch(prefix + [str(TRAIN_SH), recipe, "--num_gpus", str(part.gpus)] + tail, env,
                       part_dir / "node0", log)]
    # Two nodes of one GPU each: slots 2 so that --include can give node 1 its GPU 1 (DeepSpeed's
    # launch.py sets each node's CUDA_VISIBLE_DEVICES to the ids the hostfile gives it).
    hostfile = part_dir / "hostfile"
    hostfile.write_text("node0 slots=2\nnode1 slots=2\n")
    out = []
    for node, cores in enumerate(core_halves()):
        env = dict(base, CUDA_VISIBLE_DEVICES=str(node))
        command = (pinned(cores) + [str(TRAIN_SH), recipe, "--hostfile", str(hostfile), "--include",
                    "node0:0@node1:1", "--no_ssh", "--node_rank", str(node), "--master_addr", "127.0.0.1"] + tail)
        out.append(Launch(command, env, part_dir / f"node{node}", part_dir / f"node{node}.log"))
    return out


# -- measuring a run -------------------------------------------------------------------------

def sampler_class():
    """host_memory's sampler over the processes of the run's sessions, also noting each rank's
    pid and, on GPUs, each GPU's memory in use."""
    from .host_memory import MemorySampler

    class RunSampler(MemorySampler):
        def __init__(self, jobs: List[Job], gpus: bool, period_s: float = 1.0):
            self.jobs, self.gpus = jobs, gpus
            self.ranks: Dict[int, int] = {}
            self.gpu_mib: Dict[int, float] = {}
            self.gpu_busy: Dict[int, List[float]] = {}  # nvidia-smi's utilization.gpu, every period
            self.sm_mhz: Dict[int, float] = {}          # the lowest SM clock seen (throttling)
            self.rank_cpu_s: Dict[int, float] = {}      # each trainer process's CPU seconds so far
            # (time, the GPUs' mean busy %, rank 0's CPU s, its children's CPU s, its threads' (thread_cpu_s))
            self.readings: List[tuple] = []
            super().__init__(0, period_s=period_s)

        def _pids(self) -> List[int]:
            return [pid for job in self.jobs for pid in session_pids(job.proc.pid)]

        def _tree(self) -> tuple:
            rss = pss = 0
            for pid in self._pids():
                try:
                    full = self.psutil.Process(pid).memory_full_info()
                    rss, pss = rss + full.rss, pss + full.pss
                except self.psutil.Error:  # gone between the listing and the reading
                    pass
            return rss, pss

        def _alive(self) -> bool:
            return bool(self._pids())

        def _sample(self) -> Optional[tuple]:
            self._note_ranks()
            if self.gpus:
                for index, (mib, busy, clock) in nvidia_smi_gpus().items():
                    self.gpu_mib[index] = max(self.gpu_mib.get(index, 0.0), mib)
                    self.gpu_busy.setdefault(index, []).append(busy)
                    self.sm_mhz[index] = min(self.sm_mhz.get(index, clock), clock)
            self._note_rank_cpu()
            busy = [b[-1] for b in self.gpu_busy.values()]
            rank0 = self.ranks.get(0)
            threads = thread_cpu_s(rank0) if rank0 is not None else {}
            children = children_cpu_s(self.psutil, rank0) if rank0 is not None else None
            self.readings.append((time.monotonic(), sum(busy) / len(busy) if busy else None, self.rank_cpu_s.get(0),
                                  children, threads))
            return super()._sample()

        def _note_rank_cpu(self) -> None:
            for rank, pid in self.ranks.items():
                try:
                    times = self.psutil.Process(pid).cpu_times()
                except self.psutil.Error:  # exited: its last reading stands
                    continue
                self.rank_cpu_s[rank] = times.user + times.system

        def _note_ranks(self) -> None:
            for pid in self._pids():
                if pid in self.ranks.values() or "infcl_ds.train" not in cmdline(pid):
                    continue
                rank = environ(pid).get("RANK")
                if rank is not None and rank.isdigit():
                    self.ranks.setdefault(int(rank), pid)

    return RunSampler


def environ(pid: int) -> Dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def nvidia_smi_gpus() -> Dict[int, tuple]:
    """Each GPU's (MiB in use (every process's, the CUDA contexts included), utilization.gpu in
    percent (the share of the last sample period a kernel ran), SM clock in MHz)."""
    try:
        text = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.used,utilization.gpu,clocks.sm",
                               "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    gpus = {}
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 4 and fields[0].isdigit():
            try:
                gpus[int(fields[0])] = tuple(float(f) for f in fields[1:])
            except ValueError:
                pass
    return gpus


@dataclass
class Ran:
    """A run's launchers and what was measured while they ran."""
    launches: List[Launch]
    statuses: List[Optional[int]]
    wall_s: float
    host: dict
    ranks: Dict[int, int]
    gpu_mib: Dict[int, float]
    watch: dict

    @property
    def ok(self) -> bool:
        return all(s == 0 for s in self.statuses)

    def log_tail(self, chars: int = 3000) -> str:
        return "\n".join(f"== {launch.log}\n{launch.log.read_text(errors='replace')[-chars:]}"
                         for launch in self.launches)


PEER_GRACE_S = 60  # a launcher whose peer failed waits on it for at most this long


def run_launches(todo: List[Launch], limit_s: float, gpus: bool) -> Ran:
    """Start the launchers together, sample until all are done; past ``limit_s``, or a minute after
    one failed, the rest are ended."""
    for launch in todo:
        launch.cwd.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    jobs = [Job(launch.command, launch.env, launch.log, cwd=launch.cwd, end_with_parent=True) for launch in todo]
    sampler = sampler_class()(jobs, gpus)
    sampler.start()
    failed_at = None
    try:
        while any(job.proc.poll() is None for job in jobs):
            now = time.monotonic()
            if failed_at is None and any(job.proc.returncode not in (None, 0) for job in jobs):
                failed_at = now
            if now - started > limit_s or (failed_at is not None and now - failed_at > PEER_GRACE_S):
                break
            time.sleep(0.5)
    finally:
        for job in jobs:
            if job.processes():
                job.kill()
        sampler.done.set()
        sampler.join()
    wall_s = time.monotonic() - started
    from .host_memory import peak_host
    host_gib, host_source = peak_host(sampler.peak_used / GIB, sampler.peak_tree_pss / GIB, sampler.timeline)
    host = {"host_gib": host_gib, "host_gib_source": host_source, "host_pss_gib": sampler.peak_tree_pss / GIB,
            "host_rss_gib": sampler.peak_tree_rss / GIB, "host_used_gib": sampler.peak_used / GIB,
            "host_timeline": sampler.timeline, **sampler.sweep_report(wall_s)}
    return Ran(todo, [job.proc.returncode for job in jobs], wall_s, host, sampler.ranks, sampler.gpu_mib,
               watched(sampler, wall_s))


def watched(sampler, wall_s: float, span_s: float = 5.0) -> dict:
    """What the sampler saw of the GPUs and the trainer processes: over the whole run (start-up
    and the first step included) each GPU's mean busy share, its lowest SM clock and the cores
    each trainer process kept busy; and a timeline, every `span_s`, of [seconds since the start,
    the GPUs' mean busy share, the cores rank 0's trainer process kept busy], which says whether
    a slow step waited on the GPU or on the host, then the cores rank 0's child processes (decode
    processes, data readers) kept busy and rank 0's busiest threads (proc_cpu.busiest_threads)."""
    timeline, start = [], sampler.readings[0][0] if sampler.readings else 0.0
    bucket = []
    for reading in sampler.readings:
        bucket.append(reading)
        if reading[0] - bucket[0][0] >= span_s:
            first, last = bucket[0], bucket[-1]
            busy = [r[1] for r in bucket if r[1] is not None]
            timeline.append([round(reading[0] - start, 1), round(sum(busy) / len(busy) / 100, 3) if busy else None,
                             _rate(first[0], first[2], last[0], last[2]), _rate(first[0], first[3], last[0], last[3]),
                             busiest_threads(first[4], last[4], last[0] - first[0])])
            bucket = [reading]
    return {"gpu_busy_share": {str(i): round(sum(b) / len(b) / 100, 3) for i, b in sorted(sampler.gpu_busy.items())},
            "sm_mhz_min": {str(i): c for i, c in sorted(sampler.sm_mhz.items())},
            "rank_cores": {str(r): round(c / wall_s, 2) for r, c in sorted(sampler.rank_cpu_s.items())},
            "busy_timeline": timeline}


def _rate(t0: float, v0: Optional[float], t1: float, v1: Optional[float]) -> Optional[float]:
    """CPU seconds per second between two readings (None where either is missing, or where the
    total fell: processes that exit take their CPU seconds with them)."""
    if v0 is None or v1 is None or t1 <= t0 or v1 < v0:
        return None
    return round((v1 - v0) / (t1 - t0), 2)


def limit_s(part: Part, setup: Setup, steps: int) -> float:
    """How long a run may take before it counts as hung: start-up and compilation, then each step
    at a third of the expected rate (about 2,400 samples/s per H200 on ViT-B-16)."""
    if setup.cpu:  # the tiny model: seconds a step; start-up may wait on DeepSpeed building its CPU ops
        return 600.0
    return 600.0 + 3 * steps * part.batch / (2400.0 * part.gpus)


# -- the planner ---------------------------------------------------------------------------

def planned(part: Part, setup: Setup, sets: List[str], launch: Launch) -> dict:
    """make_plan's figures for the run, in a child process started as node 0's launcher is (its
    GPUs, its cores): the sizes the planner reads off this node, as train.sh's planner does."""
    prefix = launch.command[:3] if launch.command[0] == "taskset" else []
    command = prefix + [sys.executable, "-m", "benchmarks.scale", "--plan", "--gpus", str(part.gpus),
                        "--gpus-per-node", str(part.gpus // part.nodes), "--config", str(recipe_of(setup))]
    command += sets_args(sets) + (["--host-memory", setup.host_memory] if setup.host_memory else [])
    proc = subprocess.run(command, cwd=REPO, env=launch.env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"the planner's child failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def plan_json(config: str, sets: List[str], gpus: int, per_node: int, host_memory: Optional[str]) -> dict:
    """(The child.) The plan of the recipe on this node's sizes, and the run's identity."""
    from infcl_ds.config import load_recipe
    from infcl_ds.plan.command import memory_sizes, node_cores, parse_size
    from infcl_ds.plan.machine import read_node
    from infcl_ds.plan.plan import make_plan

    from .common import run_identity
    recipe = load_recipe(config, sets)
    node = read_node()
    sizes = memory_sizes(None, parse_size(host_memory) if host_memory else None, node)
    cores, cores_note = node_cores(None, node)
    plan = make_plan(recipe, gpus, sizes.gpu_bytes, per_node, sizes.host_bytes, cores=cores)
    return {"plan_step_s": plan.step_seconds, "plan_compute_step_s": plan.time.total,
            "plan_peak_mib": plan.allocated_peak_bytes / MIB, "plan_device_mib": plan.peak_gpu_bytes / MIB,
            "plan_node_host_gib": plan.host_bytes / GIB, "plan_fits": plan.fits, "plan_verdict": plan.verdict,
            "plan_sizes": {"gpu": sizes.gpu_note or "flag", "host": sizes.host_note or "flag",
                           "cores": cores_note or "flag"},
            "identity": run_identity()}


# -- rows --------------------------------------------------------------------------------------

def metrics(run_dir: Path) -> List[dict]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return [{k: float(v) for k, v in row.items() if v not in ("", None)} for row in csv.DictReader(f)]


def step_figures(steps: List[dict], batch: int) -> dict:
    """Rates of the steps after the first (which compiles), or of the only one there is."""
    timed = [s for s in steps[1:]] or steps
    step_s = sum(s["step_s"] for s in timed) / len(timed)
    wait = sum(s.get("decode_wait_s", 0.0) for s in timed) / len(timed)
    rates = [s["decode_rows_per_process_s"] for s in timed if s.get("decode_rows_per_process_s")]
    return {"steps": [int(s["step"]) for s in steps], "loss": [s["loss"] for s in steps],
            "steps_s": [s["step_s"] for s in steps], "first_step_s": steps[0]["step_s"],
            "steady_steps": len(steps) - 1, "step_s": step_s, "samples_per_s": batch / step_s,
            "decode_wait_s": wait, "decode_wait_share": wait / step_s,
            "decode_waits_s": [s.get("decode_wait_s", 0.0) for s in steps],
            "decode_waits_gpu_s": [s["decode_wait_gpu_s"] for s in steps if "decode_wait_gpu_s" in s],
            # the wait for the data thread's next local batch (the readers), where logged
            "batch_waits_s": [s["batch_wait_s"] for s in steps if "batch_wait_s" in s],
            # the engine's phases of the timed steps (the device's stream, waits for the host included)
            "phases_s": {name: sum(s[f"{name}_s"] for s in timed) / len(timed)
                         for name in ("encode", "loss", "reencode", "optimizer") if all(f"{name}_s" in s for s in timed)},
            # one decode process's rows per second of its own time (rank 0's): the planner's rate here
            "decode_rows_per_process_s": sum(rates) / len(rates) if rates else None,
            "decode_rows_per_process_steps": [round(s["decode_rows_per_process_s"], 1) for s in steps
                                              if "decode_rows_per_process_s" in s],
            # the share of each timed step rank 0's decode processes spent decoding (near 1: they bind)
            "decode_busy_shares": [round(s["decode_busy_share"], 3) for s in timed if "decode_busy_share" in s],
            # rank 0's GPU decoder: its rows per second of busy time, and its share of each step's chunks
            # (`hybrid`: data.gpu_decode_share auto moves it to the step's rates)
            "decode_gpu_rows_per_s": [round(s["decode_gpu_rows_per_s"]) for s in steps if "decode_gpu_rows_per_s" in s],
            "decode_gpu_shares": [round(s["decode_gpu_share"], 4) for s in steps if "decode_gpu_share" in s],
            "peak_mib": max(s.get("peak_mem_gib", 0.0) for s in steps) * 1024}


def launch_lines(ran: Ran) -> List[str]:
    """The first launcher's log (rank 0 speaks there), line by line, stripped."""
    return [line.strip() for line in ran.launches[0].log.read_text(errors="replace").splitlines()]


def planner_lines(lines: List[str]) -> List[str]:
    """What train.sh's planner said about where the node's sizes came from."""
    return [line for line in lines if "read from this node" in line or "assumed" in line]


def split_lines(lines: List[str]) -> List[str]:
    """What rank 0 said of `hybrid`'s split during the run (training/decode_split.py): each move,
    or the advice for a share the recipe set."""
    return [line for line in lines if line.startswith("decoding:") and "data.gpu_decode_share" in line]


def base_row(part: Part, setup: Setup, plan: dict, ran: Ran, nodes: int) -> dict:
    """The keys every row has; measured figures are filled in by the caller."""
    lines = launch_lines(ran)
    return {"part": part.name, "model": "infcl-tiny" if setup.cpu else part.model, "B": batch_of(part, setup),
            "part_sets": [] if setup.cpu else list(part.sets),
            "world": part.gpus, "nodes": nodes, "impl": "infcl_ds", "data": "jpeg",
            "accelerator": setup.accelerator, "set": setup.sets, **plan["identity"],
            "plan_step_s": plan["plan_step_s"], "plan_compute_step_s": plan["plan_compute_step_s"],
            # two "nodes" on one host share its memory: the planner's figure is per node
            "plan_host_gib": plan["plan_node_host_gib"] * nodes, "plan_peak_mib": plan["plan_peak_mib"],
            "plan_device_mib": plan["plan_device_mib"], "plan_fits": plan["plan_fits"],
            "plan_sizes": plan["plan_sizes"], "planner_said": planner_lines(lines), "split_said": split_lines(lines),
            "command": shlex.join(ran.launches[0].command),
            "commands": [shlex.join(launch.command) + f"   # cwd {launch.cwd}, CUDA_VISIBLE_DEVICES="
                         f"{launch.env.get('CUDA_VISIBLE_DEVICES', '(unset)')}" for launch in ran.launches],
            "wall_s": round(ran.wall_s, 1), **ran.host,
            "device_used_mib": max(ran.gpu_mib.values()) if ran.gpu_mib else None, **ran.watch,
            "rank_pids": {str(k): v for k, v in sorted(ran.ranks.items())},
            "efficiency": None, "checks": {}}


def failed_row(part: Part, setup: Setup, error: str) -> dict:
    return {"part": part.name, "B": batch_of(part, setup), "world": part.gpus, "nodes": part.nodes,
            "accelerator": setup.accelerator, "error": clipped(error)}


def clipped(text: str, head: int = 1500, tail: int = 3500) -> str:
    """The start (what failed) and the end (the logs' last lines) of a long message."""
    return text if len(text) <= head + tail else f"{text[:head]}\n[...]\n{text[-tail:]}"


def within(measured: Optional[float], plan: Optional[float]) -> Optional[bool]:
    if not measured or not plan:
        return None
    return abs(measured / plan - 1) <= PLAN_TOLERANCE


def lock_holder(run_dir: Path) -> Optional[int]:
    from infcl_ds.run_dir import LOCK_FILE
    try:
        return json.loads((run_dir / LOCK_FILE).read_text()).get("pid")
    except (OSError, ValueError):
        return None


# -- the run directory's files -----------------------------------------------------------------

def run_files(run_dir: Path) -> Dict[str, list]:
    """Every file of a run directory: [bytes, modification time (s since the epoch)]."""
    return {str(p.relative_to(run_dir)): [p.stat().st_size, round(p.stat().st_mtime, 3)]
            for p in sorted(run_dir.rglob("*")) if p.is_file()}


def written_once(run_dir: Path, reference: Optional[Path], ranks: Dict[int, int], world: int) -> dict:
    """Whether each file of the run was written by its one owner: the lock by rank 0, metrics.csv
    with one header and one row per step, each rank's checkpoint shards under its own name, and
    (beside a one-node run of the same recipe) the same files of the same sizes but the lock's."""
    lines = (run_dir / "metrics.csv").read_text().splitlines()
    steps = [line.split(",")[0] for line in lines[1:]]
    tag = next((p for p in sorted((run_dir / "checkpoints").glob("step_*")) if p.is_dir()), None)
    per_rank = {r: sorted(p.name for p in tag.glob(f"*rank{r}*")) + sorted(p.name for p in tag.glob(f"*rank_{r}_*"))
                for r in range(world)} if tag else {}
    check = {"lock_holder_pid": lock_holder(run_dir), "rank0_pid": ranks.get(0),
             "lock_written_by_rank0": ranks.get(0) is not None and lock_holder(run_dir) == ranks.get(0),
             "metrics_one_header": sum(line.startswith("step,") for line in lines) == 1,
             "metrics_steps_once": len(steps) == len(set(steps)),
             "each_rank_its_shards": bool(per_rank) and all(per_rank.values()), "rank_files": per_rank}
    if reference is not None and reference.is_dir():
        from infcl_ds.run_dir import LOCK_FILE
        mine = {k: v[0] for k, v in run_files(run_dir).items() if k != LOCK_FILE}
        theirs = {k: v[0] for k, v in run_files(reference).items() if k != LOCK_FILE}
        check["missing_beside_one_node"] = sorted(set(theirs) - set(mine))
        check["extra_beside_one_node"] = sorted(set(mine) - set(theirs))
        # sizes of the files whose content holds no path, time or host
        fixed = [k for k in theirs if k.startswith("checkpoints/step_") and k.endswith(".pt")]
        check["sizes_differ"] = sorted(k for k in fixed if mine.get(k) != theirs[k])
        check["same_files_as_one_node"] = not (check["missing_beside_one_node"] or check["extra_beside_one_node"]
                                               or check["sizes_differ"])
    check["passed"] = all(v for k, v in check.items() if k in ("lock_written_by_rank0", "metrics_one_header",
                                                                 "metrics_steps_once", "each_rank_its_shards",
                                                                 "same_files_as_one_node"))
    return check


# -- the parts ---------------------------------------------------------------------------------

def part_dir(setup: Setup, name: str) -> Path:
    return setup.work / name


def fresh(path: Path) -> Path:
    """A part's directory, emptied: a part run again measures a new run (the work folder is this
    benchmark's own)."""
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def train(part: Part, setup: Setup, shards: str, where: Path, run_dir: Path, steps: int,
          resume: bool = False) -> tuple:
    """Train ``part`` into ``run_dir`` to ``steps`` (resuming it from its latest checkpoint), its
    launchers' logs in ``where``: (the planner's figures, what the run measured)."""
    sets = recipe_sets(part, setup, shards, run_dir, steps)
    todo = launches(part, setup, sets, where, free_port(), resume=resume)
    plan = planned(part, setup, sets, todo[0])
    say(f"{part.name}: {'resuming' if resume else 'starting'} {run_dir} to step {steps} with {len(todo)} "
        f"launcher(s), logs in {where}")
    limit = limit_s(part, setup, part.resume_steps if resume else steps)
    ran = run_launches(todo, limit, not setup.cpu)
    if not ran.ok:
        why = "ended past the time limit" if ran.wall_s > limit else f"exit statuses {ran.statuses}"
        raise RuntimeError(f"{part.name}: launchers {why}:\n{ran.log_tail()}")
    return plan, ran


def measured(part: Part, setup: Setup, plan: dict, ran: Ran, run_dir: Path, nodes: int,
             after: int = 0) -> dict:
    """A row of the run's steps past ``after`` (a resume's own steps)."""
    steps = [s for s in metrics(run_dir) if s["step"] > after]
    row = {**base_row(part, setup, plan, ran, nodes), **step_figures(steps, batch_of(part, setup))}
    row["checks"].update(decode_wait_5pct=row["decode_wait_share"] <= 0.05, **memory_checks(row, setup),
                         step_within_10pct=within(row["step_s"], row["plan_step_s"]),
                         lock_written_by_rank0=lock_holder(run_dir) == ran.ranks.get(0))
    return row


def memory_checks(row: dict, setup: Setup) -> dict:
    """Host and GPU memory within PLAN_TOLERANCE of the planner's (on CPUs peak_mib is rank 0's
    resident memory: nothing the GPU plan says)."""
    return {"host_within_10pct": within(row["host_gib"], row["plan_host_gib"]),
            "gpu_within_10pct": None if setup.cpu else within(row["peak_mib"], row["plan_peak_mib"])}


def resumed(row: dict, before: int, resume_steps: int) -> dict:
    """The checks of a resume: it trained exactly the steps after the checkpoint's."""
    row["resumed_from_step"] = before
    row["checks"]["resumed"] = row["steps"] == list(range(before + 1, before + resume_steps + 1))
    return row


def run_part(part: Part, setup: Setup) -> List[dict]:
    shards = make_shards(setup, batch_of(part, setup))
    if part.resumes:
        return [resume_part(part, setup, shards)]
    where = fresh(part_dir(setup, part.name))
    run_dir = where / "run"
    plan, ran = train(part, setup, shards, where, run_dir, part.steps)
    row = measured(part, setup, plan, ran, run_dir, part.nodes)
    row["checks"][f"steady_steps_{part.steps - 1}"] = row["steady_steps"] >= part.steps - 1
    if part.nodes > 1:
        compare_with_one_node(row, setup, run_dir, ran)
    if part.resume_steps:
        plan, ran = train(part, setup, shards, where, run_dir, part.steps + part.resume_steps, resume=True)
        again = resumed(measured(part, setup, plan, ran, run_dir, part.nodes, after=part.steps), part.steps,
                        part.resume_steps)
        row["resume"] = {k: again[k] for k in ("command", "steps", "loss", "step_s", "samples_per_s",
                                               "decode_wait_share", "host_gib", "peak_mib", "wall_s",
                                               "resumed_from_step")}
        row["checks"]["resumed"] = again["checks"]["resumed"]
        row["host_gib"] = max(row["host_gib"], again["host_gib"])
        row["peak_mib"] = max(row["peak_mib"], again["peak_mib"])
        row["checks"].update(memory_checks(row, setup))
    return [row]


def resume_part(part: Part, setup: Setup, shards: str) -> dict:
    """Resume another part's run (two nodes) with one launcher of ``part.gpus`` GPUs."""
    source = PARTS[part.resumes]
    where = part_dir(setup, source.name)
    run_dir = where / "run"
    if not (run_dir / "checkpoints").is_dir():
        raise RuntimeError(f"{part.name}: no run of {source.name} in {where}: run that part first")
    before = int(max(s["step"] for s in metrics(run_dir)))
    # the run's directory stays where it is (the resume writes into it); the logs go to this part's
    plan, ran = train(part, setup, shards, fresh(part_dir(setup, part.name)), run_dir, before + part.resume_steps,
                      resume=True)
    row = resumed(measured(part, setup, plan, ran, run_dir, part.nodes, after=before), before, part.resume_steps)
    row["resumes"] = f"{source.name}'s run ({source.gpus} GPUs, {source.nodes} nodes), {run_dir}"
    row["resumed_from_world"] = source.gpus
    row["steady"] = False  # its one step includes start-up compilation
    return row


def compare_with_one_node(row: dict, setup: Setup, run_dir: Path, ran: Ran) -> None:
    """Two nodes against one-node-64k's row and run: the losses, and who wrote each file."""
    reference = next((r for r in previous_rows(setup.out) if run_key(r) == ("one-node-64k", tuple(setup.sets))),
                     None)
    rtol = LOSS_RTOL[setup.accelerator]
    row["loss_rtol"] = rtol
    if reference is None or "loss" not in reference or reference.get("accelerator") != setup.accelerator:
        row["checks"]["losses_match_one_node"] = None
        row["loss_compared_with"] = "no one-node-64k row of these settings in --out: run that part first"
    else:
        diffs = [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(row["loss"], reference["loss"])]
        row["loss_one_node"] = reference["loss"]
        row["loss_max_rel_diff"] = max(diffs) if diffs else None
        row["checks"]["losses_match_one_node"] = (len(row["loss"]) == len(reference["loss"])
                                                  and max(diffs, default=1.0) <= rtol)
    one_node_run = part_dir(setup, "one-node-64k") / "run"
    row["files"] = run_files(run_dir)
    row["written_once"] = written_once(run_dir, one_node_run if one_node_run.is_dir() else None, ran.ranks,
                                       row["world"])
    row["checks"]["each_file_written_once"] = row["written_once"]["passed"]


# -- the output file ---------------------------------------------------------------------------

def previous_rows(out: Path) -> List[dict]:
    if not out.is_file():
        return []
    return [r for r in json.loads(out.read_text())["rows"] if "part" in r]


def run_key(row: dict) -> Tuple[str, Tuple[str, ...]]:
    """A row's part and its own overrides: one part run with another decoder is another row."""
    return row["part"], tuple(row.get("set") or ())


def same_run(a: dict, b: dict) -> bool:
    """Measured together: same accelerator, device and commit (a ratio holds only within one run)."""
    return all(a.get(k) == b.get(k) for k in ("accelerator", "device", "commit"))


def with_efficiency(rows: List[dict]) -> List[dict]:
    """Weak-scaling efficiency of each row whose part names a reference: its samples/s per GPU
    over the reference row's of the same run. A row whose reference in the file is from another
    run keeps the efficiency of its own run (``efficiency_reference`` names that baseline's
    figures). Where the part has targets, the check: at least 0.95."""
    by_key = {run_key(r): r for r in rows if "samples_per_s" in r}
    for row in rows:
        part = PARTS.get(row["part"])
        if part is None or not part.reference or "samples_per_s" not in row or row.get("steady") is False:
            continue
        ref = by_key.get((part.reference, tuple(row.get("set") or ())))  # the baseline of the same overrides
        if ref is None or not same_run(ref, row):
            if "efficiency_reference" not in row:
                row["efficiency"] = None
            continue
        row["efficiency"] = (row["samples_per_s"] / row["world"]) / (ref["samples_per_s"] / ref["world"])
        row["efficiency_reference"] = {"part": part.reference, "samples_per_s": ref["samples_per_s"],
                                       "world": ref["world"], "device": ref.get("device"), "commit": ref.get("commit")}
        if part.targets:
            row["checks"]["efficiency_95pct"] = row["efficiency"] >= 0.95
    return rows


def save(setup: Setup, new: List[dict]) -> List[dict]:
    """Merge this invocation's rows into --out (a row replaces the earlier one of its part and
    overrides; the file's note, which says where its rows ran, stays) and draw: the rows, and the
    steps of each run whose split moved (scale_split-PART.png)."""
    kept = [r for r in previous_rows(setup.out) if run_key(r) not in {run_key(n) for n in new}]
    note = json.loads(setup.out.read_text())["meta"].get("note") if setup.out.is_file() else None
    order = list(PARTS)
    rows = with_efficiency(sorted(kept + new, key=lambda r: order.index(r["part"]) if r["part"] in order else 99))
    identity = next((r for r in reversed(rows) if "device" in r), {})
    meta = {k: identity.get(k) for k in ("device", "torch", "triton", "commit")}
    meta.update(accelerator=setup.accelerator, work=str(setup.work), shards=str(setup.shards),
                loss_rtol=LOSS_RTOL[setup.accelerator], plan_tolerance=PLAN_TOLERANCE)
    if note:
        meta["note"] = note
    write_rows(setup.out, rows, meta)
    from .plot import plot_scale, plot_split_moves
    plots = [(plot_scale, (setup.out, setup.out.with_suffix(".png")))]
    plots += [(plot_split_moves, (setup.out, row["part"], split_png(setup.out, row["part"]))) for row in new
              if split_moved(row)]
    for plot, args in plots:
        try:
            plot(*args)
        except Exception as err:  # noqa: BLE001 - a plot never costs the rows
            print(f"scale: no plot {args[-1].name}: {err!r}", file=sys.stderr)
    return rows


def split_moved(row: dict) -> bool:
    """Whether the run's `hybrid` split moved (data.gpu_decode_share auto following its rates)."""
    return len(set(row.get("decode_gpu_shares") or ())) > 1


def split_png(out: Path, part: str) -> Path:
    return out.with_name(f"{out.stem}_split-{part}.png")


def say(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)


def summary(row: dict) -> str:
    if "error" in row:
        return f"{row['part']}: FAILED: {row['error'][:2000]}"
    eff = f", efficiency {row['efficiency']:.3f}" if row.get("efficiency") else ""
    checks = ", ".join(f"{k} {v}" for k, v in row["checks"].items())
    return (f"{row['part']}: {row['samples_per_s']:,.1f} samples/s ({row['step_s']:.2f} s a step, plan "
            f"{row['plan_step_s']:.2f}), decode wait {row['decode_wait_share']:.1%}, host {row['host_gib']:.2f} GiB "
            f"(plan {row['plan_host_gib']:.2f}), peak {row['peak_mib']:,.0f} MiB (plan {row['plan_peak_mib']:,.0f})"
            f"{eff}, loss {[round(x, 5) for x in row['loss']]}; {checks}")


# -- start / wait: a part longer than one command ------------------------------------------------

def start(parts: List[str], setup: Setup) -> int:
    """Run ``parts`` in a process session of its own (it outlives the command that started it),
    returning at once."""
    argv = parts + ["--out", str(setup.out), "--work", str(setup.work), "--shards", str(setup.shards),
                    "--accelerator", setup.accelerator] + sets_args(setup.sets)
    argv += ["--host-memory", setup.host_memory] if setup.host_memory else []
    setup.work.mkdir(parents=True, exist_ok=True)
    log = setup.work / "scale.log"
    (setup.work / "scale.status").unlink(missing_ok=True)
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "benchmarks.scale", *argv], cwd=REPO, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                env=dict(os.environ, PYTHONUNBUFFERED="1"))
    (setup.work / "scale.pid").write_text(str(proc.pid))
    print(f"started (pid {proc.pid}), log {log}; then: python -m benchmarks.scale --wait SECONDS "
          f"--work {setup.work} --out {setup.out}")
    return 0


def wait(seconds: float, setup: Setup, started: Optional[float] = None) -> int:
    """Wait for a --start run, at most `seconds` from `started` (this process's start); print its
    log's end; copy the rows, plot and log into $OUT if set. 0: it ended (its status in
    scale.status), 3: still running, 2: none started."""
    try:
        pid = int((setup.work / "scale.pid").read_text())
    except (OSError, ValueError):
        print(f"no run started in {setup.work}", file=sys.stderr)
        return 2
    deadline = (STARTED if started is None else started) + seconds
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(5)
    log = setup.work / "scale.log"
    print("\n".join(log.read_text(errors="replace").splitlines()[-25:]))
    if os.environ.get("OUT"):
        for path in (setup.out, setup.out.with_suffix(".png"), log):
            if path.is_file():
                shutil.copy(path, os.environ["OUT"])
        # each run's own log, the heartbeat's lines of a step still running included
        for run_log in sorted(setup.work.glob("*/launch.log")) + sorted(setup.work.glob("*/resume.log")):
            shutil.copy(run_log, Path(os.environ["OUT"]) / f"{run_log.parent.name}-{run_log.name}")
    if alive(pid):
        print(f"still running (pid {pid})")
        return 3
    status = setup.work / "scale.status"
    print(f"the run has ended: status {status.read_text().strip() if status.is_file() else 'unknown'}")
    return 0


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return state_of(pid) not in (None, "Z", "X")


# -- main --------------------------------------------------------------------------------------

def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.scale", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("parts", nargs="*", help=f"of {', '.join(PARTS)}")
    p.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks" / "scale.json")
    p.add_argument("--accelerator", choices=("cuda", "cpu"), default=None,
                   help="cuda (NCCL, ViT-B-16) or cpu (gloo, the tiny model); default: cuda where nvidia-smi is")
    p.add_argument("--work", type=Path, default=Path("/tmp/infcl-ds-scale"),
                   help="the runs and their logs (outside the checkout: a lent machine's next command copies "
                        "the working tree over it)")
    p.add_argument("--shards", type=Path, default=Path(os.environ.get("SHARDS", "/tmp/infcl-ds-photos")))
    p.add_argument("--start", action="store_true", help="run PARTS in a process session of its own; return at once")
    p.add_argument("--wait", type=float, default=None, metavar="SECONDS", help="wait for a --start run")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="a recipe override for every run, after the part's own (e.g. data.decoder=hybrid); "
                        "parts compared or resumed across calls need the same ones")
    p.add_argument("--host-memory", default=None, metavar="SIZE",
                   help="the host's memory for the planner (train.sh --host-memory), e.g. 256GiB; default: what "
                        "the planner reads off this node")
    # the planner's child (internal)
    p.add_argument("--plan", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--config", help=argparse.SUPPRESS)
    p.add_argument("--gpus", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--gpus-per-node", type=int, default=1, help=argparse.SUPPRESS)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    if args.plan:
        print(json.dumps(plan_json(args.config, args.sets, args.gpus, args.gpus_per_node, args.host_memory)))
        return 0
    accelerator = args.accelerator or ("cuda" if shutil.which("nvidia-smi") else "cpu")
    setup = Setup(accelerator, args.work.resolve(), args.shards.resolve(), args.out.resolve(), args.sets,
                  args.host_memory)
    if args.wait is not None:
        return wait(args.wait, setup)
    unknown = [p for p in args.parts if p not in PARTS]
    if unknown or not args.parts:
        raise SystemExit(f"parts: {', '.join(PARTS)} (got {', '.join(unknown) or 'none'})")
    if args.start:
        return start(args.parts, setup)
    status = 0
    try:
        for name in args.parts:
            part = PARTS[name]
            try:
                rows = run_part(part, setup)
            except Exception:  # noqa: BLE001 - a failed part is a row saying why; the next part runs
                rows, status = [failed_row(part, setup, traceback.format_exc())], 1
            rows = save(setup, rows)
            print(summary(next(r for r in rows if r["part"] == name)), flush=True)
    finally:
        (setup.work / "scale.status").parent.mkdir(parents=True, exist_ok=True)
        (setup.work / "scale.status").write_text(f"{status}\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
