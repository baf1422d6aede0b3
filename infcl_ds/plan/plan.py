"""`make_plan`: does a recipe fit on N GPUs, how long is a step, and what limits it.

Three limits are weighed: memory per GPU, host memory per node, and (given a budget) step
time. Each gets a growth factor: how many times the global batch could grow on these GPUs
before that limit is reached (below 1: it is exceeded already). The binding limit is the one
with the smallest factor. A recipe that exceeds a limit gets a verdict naming the biggest
component and the remedies that would make it fit, each checked by planning it.
"""
import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Tuple

from ..config import Recipe, check_world
from ..config.recipe import MAX_PROCESSES, DataSection, compile_supported
from ..data.footprint import image_bytes_per_sample, kept_pixel_rows
from ..engine.tower_footprint import ModelEstimate, UnmodelledModelError, estimate_model
from . import memory as mem
from .refusal import PlanError
from .machine import CoreShare, split_cores
from .timing import DEFAULT_NETWORK, NETWORKS, InputRate, KernelRates, StepTime, input_rate, step_time

# A DGX H100/H200-class node has 2 TB; the planner says when it assumed this.
DEFAULT_HOST_MEMORY = 2 << 40
GPU_LIMIT, HOST_LIMIT, TIME_LIMIT = "GPU memory", "host memory per node", "step time"
# The most GPUs a remedy may propose.
MAX_GPUS = 16384

# How a verdict names a GPU component (FEATURES and FEATURE_GRADS count together).
_BLAME = {mem.PARAMS: "parameters need", mem.GRADS: "gradients need", mem.OPTIM: "optimizer states need",
          mem.GRAD_SUM: "the fp32 gradient sum needs", mem.ZERO_BUFFERS: "ZeRO's buffers need",
          mem.RUNTIME: "the runtime reserve needs", mem.ACTIVATIONS: "one chunk's activations need",
          mem.FEATURES: "cached features and their gradients need", mem.LOSS_BUFFERS: "the loss and ring buffers need",
          mem.PIXELS_KEPT: "decoded chunks kept for the grad pass (data.keep_decoded_gib) need",
          mem.DEVICE_WINDOW: "the GPU decoder's window (data.decode_window_gib) needs"}
# Remedies tried first for each culprit, then any other that works.
_RELEVANT = {mem.FEATURES: ("offload", "gpus"), mem.ACTIVATIONS: ("chunk", "checkpointing"),
             mem.PARAMS: ("zero", "gpus"), mem.GRADS: ("zero", "gpus"), mem.OPTIM: ("zero", "gpus"),
             mem.GRAD_SUM: ("zero", "gpus"), mem.ZERO_BUFFERS: ("zero", "gpus"),
             mem.LOSS_BUFFERS: ("gpus",), mem.RUNTIME: ("gpus",), mem.PIXELS_KEPT: ("keep", "gpus"), mem.DEVICE_WINDOW: ("gpus",),
             HOST_LIMIT: ("gpus", "workers", "no-offload"), TIME_LIMIT: ("gpus",)}


@dataclass(frozen=True)
class Limit:
    name: str
    used: float            # bytes, or seconds for step time
    capacity: float
    growth: float          # times the global batch can grow before reaching the capacity


@dataclass(frozen=True)
class AutoDecodeWorkers:
    """`data.decode_workers: auto` resolved: the count and why, in words for the log and the plan."""
    count: int
    why: str


@dataclass(frozen=True)
class AutoDecoder:
    """`data.decoder: auto` resolved: the decoder and why, in words for the log and the plan."""
    name: str
    why: str


@dataclass(frozen=True)
class Plan:
    recipe: Recipe
    model: ModelEstimate
    gpus: int
    gpus_per_node: int
    local_batch: int
    gpu_memory_bytes: int
    host_memory_bytes: int
    gpu: mem.GpuMemory
    host: Dict[str, int]
    time: StepTime
    limits: Tuple[Limit, ...]
    host_memory_assumed: bool = False
    image_bytes: int = 0                   # stored bytes per image (encoded host batches)
    image_bytes_source: str = ""
    inputs: Optional[InputRate] = None     # decoding against the step (encoded host batches)
    decode_workers: Optional[AutoDecodeWorkers] = None  # data.decode_workers: auto, as resolved here
    decoder: Optional[AutoDecoder] = None  # data.decoder: auto, as resolved here
    cores_assumed: bool = False            # the node's cores were not given: ASSUMED_CORES_PER_GPU
    verdict: str = ""
    remedies: Tuple[str, ...] = ()
    advice: Tuple[str, ...] = ()           # a fitting recipe's faster alternatives

    @property
    def components(self) -> Dict[str, int]:
        """Bytes per GPU by component."""
        return dict(self.gpu.components)

    @property
    def peak_gpu_bytes(self) -> int:
        return self.gpu.peak

    @property
    def allocated_peak_bytes(self) -> int:  # GpuMemory.allocated_peak: what `infcl-ds bench train` measures
        return self.gpu.allocated_peak

    @property
    def host_bytes(self) -> int:
        return sum(self.host.values())

    @property
    def step_seconds(self) -> float:
        """The step: its compute, or the decoding of its inputs where that is slower."""
        return self.inputs.step_seconds(self.time.total) if self.inputs else self.time.total

    @property
    def fits(self) -> bool:
        return all(limit.growth >= 1 for limit in self.limits)

    @property
    def binding(self) -> str:
        return min(self.limits, key=lambda limit: limit.growth).name

    def limit(self, name: str) -> Limit:
        return next(limit for limit in self.limits if limit.name == name)


def _growth(capacity: float, fixed: float, scaling: float) -> float:
    """k such that fixed + k * scaling = capacity."""
    if scaling <= 0:
        return math.inf if fixed <= capacity else 0.0
    return (capacity - fixed) / scaling


def _gpu_limit(gpu: mem.GpuMemory, capacity: int) -> Limit:
    """Features, their gradients and the loss's buffers grow with the local batch; the rest
    (activations of one chunk included) does not."""
    scaling = {mem.FEATURES, mem.FEATURE_GRADS, mem.LOSS_BUFFERS}
    growth = math.inf
    for phase, names in gpu.phases.items():
        grows = sum(gpu.components[n] for n in names if n in scaling)
        growth = min(growth, _growth(capacity, gpu.phase_bytes(phase) - grows, grows))
    return Limit(GPU_LIMIT, gpu.peak, capacity, growth)


def estimate(name: str) -> ModelEstimate:
    """The towers' footprint of model ``name`` as the engine states it
    (engine/tower_footprint.py), a model it does not model refused as a PlanError."""
    try:
        return estimate_model(name)
    except UnmodelledModelError as err:
        raise PlanError(f"plan: {err}") from err


def _time_growth(time: StepTime, budget: float) -> float:
    """k with encoders * k + loss * k^2 = budget (the loss grows as the batch squared)."""
    a, b = time.loss, time.encoders
    if a <= 0:
        return budget / b if b > 0 else math.inf
    return (-b + math.sqrt(b * b + 4 * a * budget)) / (2 * a)


def assess(recipe: Recipe, gpus: int, gpu_memory_bytes: int, gpus_per_node: int, host_memory_bytes: int,
           rates: KernelRates, *, encoder_tflops: Optional[float], network: str, max_step_s: Optional[float],
           model: Optional[ModelEstimate] = None) -> Plan:
    """The plan's numbers, without a verdict. Raises RecipeError if the batch does not split
    over ``gpus``."""
    check_world(recipe, gpus)
    model = model or estimate(recipe.model.name)
    local = recipe.local_batch(gpus)
    gpu = mem.gpu_memory(model, recipe, gpus)
    image_bytes, image_bytes_source = image_bytes_per_sample(recipe.data)
    host = mem.host_memory(model, recipe, gpus, gpus_per_node, image_bytes)
    time = step_time(model, recipe, gpus, rates, gpus_per_node, network, encoder_tflops)
    # The decode pool's pieces and the processes' reserve do not grow with the batch.
    host_grows = host[mem.INPUTS] + host[mem.OFFLOADED]
    limits = [_gpu_limit(gpu, gpu_memory_bytes),
              Limit(HOST_LIMIT, sum(host.values()), host_memory_bytes,
                    _growth(host_memory_bytes, sum(host.values()) - host_grows, host_grows))]
    if max_step_s is not None:
        limits.append(Limit(TIME_LIMIT, time.total, max_step_s, _time_growth(time, max_step_s)))
    return Plan(recipe=recipe, model=model, gpus=gpus, gpus_per_node=gpus_per_node, local_batch=local,
                gpu_memory_bytes=gpu_memory_bytes, host_memory_bytes=host_memory_bytes, gpu=gpu, host=host,
                time=time, limits=tuple(limits), image_bytes=image_bytes, image_bytes_source=image_bytes_source,
                inputs=(input_rate(recipe, local, time.total,
                                   kept_pixel_rows(recipe.data, local, model.image_size, recipe.batch.chunk))
                        if recipe.data.host_batch == "encoded" else None))


# batch.chunk: auto. Powers of two up to this: larger chunks make a step faster (measured:
# docs/planner.md), but past this they only add activation memory.
AUTO_CHUNK_MAX = 2048
# Share of the GPU's memory the planned peak may take at the chosen chunk: room for what the
# planner does not model (fragmentation beyond its reserve, other processes).
AUTO_CHUNK_MEMORY_SHARE = 0.9
# batch.chunk: auto without a GPU to plan for (the CPU tests and demos): the recipe default.
AUTO_CHUNK_CPU = 64


def auto_chunk(recipe: Recipe, gpus: int, gpu_memory_bytes: int, gpus_per_node: int = 8) -> int:
    """`batch.chunk: auto` on `gpus` GPUs of `gpu_memory_bytes`: the largest power of two, at most
    AUTO_CHUNK_MAX and the local batch, whose planned GPU peak is within
    AUTO_CHUNK_MEMORY_SHARE of the memory (the local batch itself when it is smaller). Raises
    PlanError when even a chunk of 1 does not fit. Only the GPU's footprint decides it
    (memory.gpu_memory: the engine's and the data's on the device), so the host's and the step
    time are not planned: no shard is opened, no rate read."""
    check_world(recipe, gpus)
    recipe = with_decoder(recipe, gpus, gpu_memory_bytes, gpus_per_node)  # the resolvers', if resolved
    recipe = with_decode_workers(recipe, planned_cores(gpus, gpus_per_node))
    local = recipe.local_batch(gpus)
    budget = int(gpu_memory_bytes * AUTO_CHUNK_MEMORY_SHARE)
    top = min(local, AUTO_CHUNK_MAX)
    candidates = [top] + [1 << k for k in range(top.bit_length() - 1, -1, -1) if (1 << k) < top]
    model = estimate(recipe.model.name)
    if recipe.data.keep_decoded_gib == "auto":  # sized after the chunk, in what the chunk leaves
        recipe = recipe_with(recipe, "data", keep_decoded_gib=0.0)
    for chunk in candidates:
        peak = mem.gpu_memory(model, recipe_with(recipe, "batch", chunk=chunk), gpus).peak
        if peak <= budget:
            return chunk
    raise PlanError(f"batch.chunk=auto: not even a chunk of 1 fits {AUTO_CHUNK_MEMORY_SHARE:.0%} of "
                    f"{gpu_memory_bytes / mem.GIB:.4g} GiB per GPU (planned peak {mem.gib(peak)} GiB)")


# data.keep_decoded_gib: auto on CPU ranks: host memory the kept chunks may take per rank.
AUTO_KEEP_CPU_GIB = 1.0


def auto_keep_gib(recipe: Recipe, gpus: int, gpu_memory_bytes: int, gpus_per_node: int = 8) -> float:
    """`data.keep_decoded_gib: auto` (with a numeric batch.chunk): the decoded pixels of as many
    whole chunks of the local batch (all of them where they fit) as the planned peak leaves room
    for within AUTO_CHUNK_MEMORY_SHARE of the GPU's memory; 0 when none fit."""
    if recipe.data.host_batch == "decoded":
        return 0.0
    recipe = with_decoder(recipe, gpus, gpu_memory_bytes, gpus_per_node)  # the resolvers', if resolved
    recipe = with_decode_workers(recipe, planned_cores(gpus, gpus_per_node))
    check_world(recipe, gpus)
    model = estimate(recipe.model.name)
    bare = mem.gpu_memory(model, recipe_with(recipe, "data", keep_decoded_gib=0.0), gpus).peak
    row = 3 * model.image_size ** 2
    local = recipe.local_batch(gpus)
    rows = min(local, max(0, int(gpu_memory_bytes * AUTO_CHUNK_MEMORY_SHARE) - bare) // row)
    rows = rows if rows == local else rows - rows % recipe.batch.chunk
    return rows * row / mem.GIB  # exact: kept_rows gives `rows` back


# data.decode_workers: auto where the node is not known (make_plan without `cores`, the probes of
# auto_chunk and auto_keep_gib): cores per GPU of a training node, on the low side (one H200 host
# here has 16; a DGX H100 has 224 logical cores for 8 GPUs).
ASSUMED_CORES_PER_GPU = 16


def _busy_besides_decoding(data: DataSection) -> Tuple[int, str]:
    """(cores, in words) that else stay busy on a rank while its decode processes run: the
    training process (it drives the GPU and assembles the next batch), each data.workers reader
    (reads the stored bytes and tokenizes) and, for data.decoder=hybrid, the GPU decoder's lane
    thread (it drives nvJPEG). Decode processes beyond the cores these leave would only take
    turns with them and with each other."""
    busy = [(1, "the training process")]
    if data.workers:
        busy.append((data.workers, f"{data.workers} reader{'s' if data.workers > 1 else ''}"))
    if data.decoder == "hybrid":
        busy.append((1, "the GPU decoder's lane thread"))
    words = [text for _, text in busy]
    return sum(n for n, _ in busy), ", ".join(words[:-1]) + (" and " if len(words) > 1 else "") + words[-1]


def auto_decode_workers(data: DataSection, share: CoreShare) -> AutoDecodeWorkers:
    """`data.decode_workers: auto` on a rank with `share` of its node's cores: the cores left by
    _busy_besides_decoding, at most MAX_PROCESSES. At least 1 where the share has 2 cores or
    more, so that decoding overlaps the step; 0 (decode in the training process) on a
    share of one core, where a decode process would only take turns with the training process
    and add its window. 0 where nothing decodes in processes (data.decoder=nvjpeg, decoded host
    batches)."""
    if data.host_batch == "decoded":
        return AutoDecodeWorkers(0, "data.host_batch=decoded: the data workers decode")
    if data.decoder == "nvjpeg":
        return AutoDecodeWorkers(0, "data.decoder=nvjpeg decodes on the GPU")
    if share.cores <= 1:
        return AutoDecodeWorkers(0, f"{share.text}: decoded in the training process, which a decode "
                                    "process would only take turns with")
    busy, words = _busy_besides_decoding(data)
    left = share.cores - busy
    count = min(max(1, left), MAX_PROCESSES)
    bound = ("; at least 1, so that decoding overlaps the step" if left < 1 else
             f"; at most {MAX_PROCESSES:,}" if left > MAX_PROCESSES else "")
    return AutoDecodeWorkers(count, f"{share.text}, less {words}{bound}")


def auto_decoder(recipe: Recipe, gpus: int, gpu_memory_bytes: int, gpus_per_node: int, share: CoreShare,
                 rates: Optional[KernelRates] = None) -> AutoDecoder:
    """`data.decoder: auto` on a GPU rank with `share` of its node's cores, from the measured
    decode rates (data/footprint.py): pil where its decode processes (data.decode_workers, auto
    resolved for `share`) keep up with the planned step: open_clip's pixels exactly; else hybrid,
    where the GPU decodes a share of each chunk beside them. The step is planned as for pil, the
    recipe's other `auto` values resolved as the trainer resolves them; no shard is opened."""
    if recipe.data.host_batch == "decoded":
        return AutoDecoder("pil", "data.host_batch=decoded: the data workers decode, with PIL")
    pil = with_decode_workers(recipe_with(recipe, "data", decoder="pil"), share)
    pil = _without_auto(pil, gpus, gpu_memory_bytes, gpus_per_node)
    model = estimate(recipe.model.name)
    local = pil.local_batch(gpus)
    time = step_time(model, pil, gpus, rates or KernelRates.load(), gpus_per_node, DEFAULT_NETWORK, None)
    inputs = input_rate(pil, local, time.total, kept_pixel_rows(pil.data, local, model.image_size, pil.batch.chunk))
    rate = (f"{inputs.workers} PIL processes decode {inputs.available:,.0f} samples/s of the {inputs.needed:,.0f} "
            f"a {time.total:.1f} s step needs")
    if not inputs.binds:
        return AutoDecoder("pil", f"{rate}: they keep up, with open_clip's pixels exactly")
    return AutoDecoder("hybrid", f"{rate}: the GPU decodes a share of each chunk beside them")


def planned_cores(gpus: int, gpus_per_node: int, cores: Optional[int] = None) -> CoreShare:
    """A rank's share of a node's `cores` (ASSUMED_CORES_PER_GPU per rank where None), the
    node's ranks splitting them: what each rank of the launch will find (machine.rank_cores)."""
    ranks = min(gpus, gpus_per_node)
    return split_cores(ASSUMED_CORES_PER_GPU * ranks if cores is None else cores, ranks, "each rank's share",
                       "on a node")


def with_decoder(recipe: Recipe, gpus: int, gpu_memory_bytes: int, gpus_per_node: int,
                 share: Optional[CoreShare] = None) -> Recipe:
    """The recipe with `data.decoder: auto` resolved for `share` (default: planned_cores) on these
    GPUs (unchanged otherwise)."""
    if recipe.data.decoder != "auto":
        return recipe
    share = share or planned_cores(gpus, gpus_per_node)
    return recipe_with(recipe, "data", decoder=auto_decoder(recipe, gpus, gpu_memory_bytes, gpus_per_node, share).name)


def with_decode_workers(recipe: Recipe, share: CoreShare) -> Recipe:
    """The recipe with `data.decode_workers: auto` resolved for `share` (unchanged otherwise)."""
    if recipe.data.decode_workers != "auto":
        return recipe
    return recipe_with(recipe, "data", decode_workers=auto_decode_workers(recipe.data, share).count)


def _without_auto(recipe: Recipe, gpus: int, gpu_memory_bytes: int, gpus_per_node: int) -> Recipe:
    """batch.chunk and data.keep_decoded_gib as the trainer resolves `auto` on these GPUs
    (data.decode_workers resolved before: both may count the GPU decoder's share)."""
    if recipe.batch.chunk == "auto":
        recipe = recipe_with(recipe, "batch", chunk=auto_chunk(recipe, gpus, gpu_memory_bytes, gpus_per_node))
    if recipe.data.keep_decoded_gib == "auto":
        recipe = recipe_with(recipe, "data", keep_decoded_gib=auto_keep_gib(recipe, gpus, gpu_memory_bytes,
                                                                            gpus_per_node))
    return recipe


def make_plan(recipe: Recipe, gpus: int, gpu_memory_bytes: int, gpus_per_node: int = 8,
              host_memory_bytes: Optional[int] = None, *, cores: Optional[int] = None,
              encoder_tflops: Optional[float] = None, network: str = DEFAULT_NETWORK,
              max_step_s: Optional[float] = None, rates: Optional[KernelRates] = None) -> Plan:
    """Plan ``recipe`` on ``gpus`` GPUs of ``gpu_memory_bytes`` each, ``gpus_per_node`` per node
    with ``host_memory_bytes`` of host memory and ``cores`` usable cores each (defaults:
    DEFAULT_HOST_MEMORY and ASSUMED_CORES_PER_GPU per GPU, marked as assumed);
    ``encoder_tflops`` as timing.encoder_times. Raises RecipeError when the batch does not split
    over the GPUs and PlanError when the model cannot be estimated; a recipe that does not fit
    gets ``fits == False`` and a verdict that says why and what would fix it."""
    if network not in NETWORKS:
        raise PlanError(f"plan: network must be one of {list(NETWORKS)}, got {network!r}")
    rates = rates or KernelRates.load()
    share = planned_cores(gpus, gpus_per_node, cores)
    decoder = decode_workers = None
    if recipe.data.decoder == "auto":  # what each rank will choose (training/resolve.py), first: the
        # decode processes count the GPU decoder's lane thread
        decoder = auto_decoder(recipe, gpus, gpu_memory_bytes, gpus_per_node, share, rates)
        recipe = recipe_with(recipe, "data", decoder=decoder.name)
    if recipe.data.decode_workers == "auto":
        decode_workers = auto_decode_workers(recipe.data, share)
        recipe = recipe_with(recipe, "data", decode_workers=decode_workers.count)
    recipe = _without_auto(recipe, gpus, gpu_memory_bytes, gpus_per_node)  # what the trainer will choose
    assumed = host_memory_bytes is None
    host_memory_bytes = DEFAULT_HOST_MEMORY if assumed else host_memory_bytes
    probe = functools.partial(assess, gpu_memory_bytes=gpu_memory_bytes, gpus_per_node=gpus_per_node,
                              host_memory_bytes=host_memory_bytes, rates=rates, encoder_tflops=encoder_tflops,
                              network=network, max_step_s=max_step_s)
    plan = dataclasses.replace(probe(recipe, gpus), host_memory_assumed=assumed, decode_workers=decode_workers,
                               decoder=decoder, cores_assumed=cores is None)
    if plan.fits:
        advice = ()
        if not compile_supported(recipe.zero.stage) and recipe.zero.base_config is None:
            # Compiled ZeRO-2 steps are faster than ZeRO-3's, which cannot compile the towers
            # (docs/planner.md has both runs). Say so when ZeRO-2 fits.
            stage2 = probe(recipe_with(recipe, "zero", stage=2), gpus, model=plan.model)
            if stage2.fits:
                advice = (f"zero.stage=2 also fits ({mem.gib(stage2.peak_gpu_bytes)} GiB per GPU) and can compile "
                          f"the towers (model.compile), which ZeRO-3 cannot: faster steps (docs/planner.md)",)
        return dataclasses.replace(plan, advice=advice, verdict=f"fits: {mem.gib(plan.peak_gpu_bytes)} GiB of "
                                                                f"{gpu_memory_bytes / mem.GIB:.4g} GiB")

    def fits(candidate: Recipe, n: int) -> bool:
        try:
            return probe(candidate, n, model=plan.model).fits
        except ValueError:  # RecipeError: e.g. the chunk no longer fits the local batch
            return False

    culprit, problem = _problem(plan)
    remedies = _remedies(recipe, gpus, gpus_per_node, culprit, fits)
    fix = " or ".join(remedies[:2]) or ("no single change of GPUs, chunk, checkpointing, ZeRO stage, offload, "
                                        "workers or kept decoded chunks fits")
    return dataclasses.replace(plan, verdict=f"does not fit: {problem}; {fix}", remedies=tuple(remedies))


def _problem(plan: Plan) -> Tuple[str, str]:
    """(culprit, description) of the most exceeded limit."""
    limit = plan.limit(plan.binding)
    if limit.name == HOST_LIMIT:
        inputs = plan.host[mem.INPUTS]
        return HOST_LIMIT, (f"host memory per node needs {mem.gib(limit.used)} GiB of {mem.gib(limit.capacity)} GiB "
                            f"({mem.gib(inputs)} GiB of input batches)")
    if limit.name == TIME_LIMIT:
        return TIME_LIMIT, f"a step takes {limit.used:.0f} s, over the {limit.capacity:g} s budget"
    gpu = plan.gpu
    activations = gpu.components[mem.ACTIVATIONS]
    if activations >= plan.gpu_memory_bytes:
        return mem.ACTIVATIONS, (f"one chunk's activations alone need {mem.gib(activations)} GiB of "
                                 f"{mem.gib(plan.gpu_memory_bytes)} GiB per GPU")
    sizes = {name: gpu.components[name] for name in gpu.phases[gpu.peak_phase]}
    if mem.FEATURE_GRADS in sizes:
        sizes[mem.FEATURES] = sizes.get(mem.FEATURES, 0) + sizes.pop(mem.FEATURE_GRADS)
    culprit = max(sizes, key=sizes.get)
    return culprit, (f"{_BLAME[culprit]} {mem.gib(sizes[culprit])} GiB "
                     f"(peak {mem.gib(gpu.peak)} of {mem.gib(plan.gpu_memory_bytes)} GiB per GPU, {gpu.peak_phase})")


def recipe_with(recipe: Recipe, section: str, **changes) -> Recipe:
    """A copy of `recipe` with keys of one section changed (no validation: the planner's probes)."""
    return recipe.model_copy(update={section: getattr(recipe, section).model_copy(update=changes)})


def _largest_below(value: int, fits: Callable[[int], bool]) -> Optional[int]:
    """The largest v in [1, value) with fits(v), for fits monotone (true below some point)."""
    lo, hi = 0, value  # fits(lo) is taken as true, fits(hi) as false
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo if lo >= 1 and fits(lo) else None


def _remedies(recipe: Recipe, gpus: int, gpus_per_node: int, culprit: str,
              fits: Callable[[Recipe, int], bool]) -> List[str]:
    """Single changes that make the recipe fit, those relevant to the culprit first."""
    def first(section: str, key: str, values: Iterable) -> Optional[str]:
        """`set section.key=value` for the first of ``values``, other than the recipe's, that fits."""
        current = getattr(getattr(recipe, section), key)
        for value in values:
            if value != current and fits(recipe_with(recipe, section, **{key: value}), gpus):
                return f"set {section}.{key}={str(value).lower()}"
        return None

    def more_gpus():
        step = gpus_per_node if gpus >= gpus_per_node else 1
        for n in range((gpus // step + 1) * step, MAX_GPUS + 1, step):
            if recipe.batch.global_size % n == 0 and fits(recipe, n):
                return f"use {n} GPUs"

    def chunk():
        best = _largest_below(recipe.batch.chunk, lambda c: fits(recipe_with(recipe, "batch", chunk=c), gpus))
        return f"set batch.chunk={best}" if best else None

    def keep_fewer():
        def fits_keeping(gib):
            return fits(recipe_with(recipe, "data", keep_decoded_gib=float(gib)), gpus)
        kept = recipe.data.keep_decoded_gib  # a number here: make_plan resolved auto
        if kept > 0:
            gib = _largest_below(math.ceil(kept), fits_keeping) or 0  # whole GiB; 0: decode twice
            if gib or fits_keeping(0):
                return f"set data.keep_decoded_gib={gib}"

    zero = recipe.zero
    candidates = {"gpus": more_gpus, "keep": keep_fewer,
                  "offload": lambda: first("batch", "offload_features", (True,)),
                  "no-offload": lambda: first("batch", "offload_features", (False,)),
                  "zero": lambda: first("zero", "stage", range(zero.stage + 1, 4) if zero.base_config is None else ()),
                  "chunk": chunk, "checkpointing": lambda: first("model", "grad_checkpointing", (True,)),
                  "workers": lambda: first("data", "workers", range(recipe.data.workers - 1, -1, -1))}
    relevant = _RELEVANT.get(culprit, ())
    order = list(relevant) + [key for key in candidates if key not in relevant]
    return [text for text in (candidates[key]() for key in order) if text]
