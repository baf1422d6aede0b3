"""`make_plan`: does a recipe fit on N GPUs, how long is a step, and what limits it.

Three limits are weighed: memory per GPU, host memory per node, and (given a budget) step
time. Each gets a growth factor: how many times the global batch could grow on these GPUs
before that limit is reached (below 1: it is exceeded already). The binding limit is the one
with the smallest factor. A recipe that exceeds a limit gets a verdict naming the biggest
component and the remedies that would make it fit, each checked by planning it.

CPU ranks (a GPU memory of 0, as plan/auto_values.py's RankSizes) hold what a GPU would in
host memory: there the one limit is host memory per node, and the step time is not modelled
(the encoder, loss and link rates are measured on GPUs).
"""
import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Tuple

from ..config import Recipe, check_world
from ..config.recipe import compile_supported
from ..data.footprint import gpu_decode_share, hybrid_gpu_share, image_bytes_per_sample, kept_pixel_rows
from ..engine.tower_footprint import ModelEstimate
from . import memory as mem
from .overlap import seconds_text, window_needed, windows_needed_together
from .refusal import PlanError
from .auto_values import (AUTO_WINDOW_HOST_SHARE, Choice, RankSizes, estimate, planned_cores, recipe_with,
                      resolve_autos)
from .timing import (DEFAULT_NETWORK, NETWORKS, Decoding, KernelRates, StepTime, decoding, step_decoders, step_time)

# A DGX H100/H200-class node has 2 TB; the planner says when it assumed this.
DEFAULT_HOST_MEMORY = 2 << 40
GPU_LIMIT, HOST_LIMIT, TIME_LIMIT = "GPU memory", "host memory per node", "step time"
# The most ranks a plan is made for (the command's rank counts) and a remedy may propose.
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
    decoding: Optional[Decoding] = None    # decoding against the step (encoded host batches)
    choices: Tuple[Choice, ...] = ()       # what the recipe's `auto` values became (plan/auto_values.py)
    cores_assumed: bool = False            # the node's cores were not given: ASSUMED_CORES_PER_GPU
    verdict: str = ""
    remedies: Tuple[str, ...] = ()
    advice: Tuple[str, ...] = ()           # a fitting recipe's faster alternatives
    unbinding: Tuple[str, ...] = ()        # where the engine waits for decoded rows: what would shorten it

    @property
    def on_cpu(self) -> bool:
        """CPU ranks: no GPU memory (RankSizes' convention; the trainer's DS_ACCELERATOR=cpu)."""
        return self.gpu_memory_bytes == 0

    def ranks_text(self, n: Optional[int] = None) -> str:
        """'32 GPUs', or '2 CPU ranks' on CPU ranks (n: the plan's own count)."""
        return ranks_text(self.gpus if n is None else n, self.on_cpu)

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
        """The step: its compute and what the engine waits for decoded rows (plan/overlap.py)."""
        return self.time.total + (self.decoding.wait_s if self.decoding else 0.0)

    def choice(self, key: str) -> Optional[Choice]:
        """What `auto` became for recipe key `key` (None where the recipe gave a value)."""
        return next((c for c in self.choices if c.key == key), None)

    @property
    def fits(self) -> bool:
        return all(limit.growth >= 1 for limit in self.limits)

    @property
    def binding(self) -> str:
        return min(self.limits, key=lambda limit: limit.growth).name

    def limit(self, name: str) -> Limit:
        return next(limit for limit in self.limits if limit.name == name)


def ranks_text(n: int, on_cpu: bool) -> str:
    """'1 GPU', '32 GPUs', '2 CPU ranks'."""
    return f"{n} {'CPU rank' if on_cpu else 'GPU'}{'' if n == 1 else 's'}"


def _growth(capacity: float, fixed: float, scaling: float) -> float:
    """k such that fixed + k * scaling = capacity."""
    if scaling <= 0:
        return math.inf if fixed <= capacity else 0.0
    return (capacity - fixed) / scaling


# What a GPU holds that grows with the local batch.
_GROWS_WITH_BATCH = frozenset({mem.FEATURES, mem.FEATURE_GRADS, mem.LOSS_BUFFERS})


def _gpu_limit(gpu: mem.GpuMemory, capacity: int) -> Limit:
    """Features, their gradients and the loss's buffers grow with the local batch; the rest
    (activations of one chunk included) does not."""
    growth = math.inf
    for phase, names in gpu.phases.items():
        grows = sum(gpu.components[n] for n in names if n in _GROWS_WITH_BATCH)
        growth = min(growth, _growth(capacity, gpu.phase_bytes(phase) - grows, grows))
    return Limit(GPU_LIMIT, gpu.peak, capacity, growth)


def _time_growth(time: StepTime, budget: float) -> float:
    """k with encoders * k + loss * k^2 = budget (the loss grows as the batch squared)."""
    a, b = time.loss, time.encoders
    if a <= 0:
        return budget / b if b > 0 else math.inf
    return (-b + math.sqrt(b * b + 4 * a * budget)) / (2 * a)


def assess(recipe: Recipe, gpus: int, gpu_memory_bytes: int, gpus_per_node: int, host_memory_bytes: int,
           rates: KernelRates, *, encoder_tflops: Optional[float], network: str, max_step_s: Optional[float],
           model: Optional[ModelEstimate] = None) -> Plan:
    """The plan's numbers, without a verdict (``gpu_memory_bytes`` 0: CPU ranks). Raises
    RecipeError if the batch does not split over ``gpus``."""
    check_world(recipe, gpus)
    model = model or estimate(recipe.model.name)
    local = recipe.local_batch(gpus)
    gpu = mem.gpu_memory(model, recipe, gpus, on_cpu=gpu_memory_bytes == 0)
    image_bytes, image_bytes_source = image_bytes_per_sample(recipe.data)
    host = mem.host_memory(model, recipe, gpus, gpus_per_node, image_bytes)
    time = step_time(model, recipe, gpus, rates, gpus_per_node, network, encoder_tflops)
    # The decode pool's pieces and the processes' reserve do not grow with the batch.
    host_grows = host[mem.INPUTS] + host[mem.OFFLOADED]
    on_cpu = gpu_memory_bytes == 0
    if on_cpu:  # a CPU rank's tensors are host memory; no CUDA runtime beside them
        ranks = min(gpus, gpus_per_node)
        host[mem.RANK_TENSORS] = ranks * gpu.allocated_peak
        host_grows += ranks * sum(gpu.components[n] for n in gpu.phases[gpu.peak_phase] if n in _GROWS_WITH_BATCH)
    host_limit = Limit(HOST_LIMIT, sum(host.values()), host_memory_bytes,
                       _growth(host_memory_bytes, sum(host.values()) - host_grows, host_grows))
    limits = [host_limit] if on_cpu else [_gpu_limit(gpu, gpu_memory_bytes), host_limit]
    if max_step_s is not None:
        limits.append(Limit(TIME_LIMIT, time.total, max_step_s, _time_growth(time, max_step_s)))
    return Plan(recipe=recipe, model=model, gpus=gpus, gpus_per_node=gpus_per_node, local_batch=local,
                gpu_memory_bytes=gpu_memory_bytes, host_memory_bytes=host_memory_bytes, gpu=gpu, host=host,
                time=time, limits=tuple(limits), image_bytes=image_bytes, image_bytes_source=image_bytes_source,
                decoding=(decoding(recipe, local, time, kept_pixel_rows(recipe.data, local, model.image_size,
                                                                        recipe.batch.chunk), model.image_size)
                          if recipe.data.host_batch == "encoded" and not on_cpu else None))


def make_plan(recipe: Recipe, gpus: int, gpu_memory_bytes: int, gpus_per_node: int = 8,
              host_memory_bytes: Optional[int] = None, *, cores: Optional[int] = None,
              encoder_tflops: Optional[float] = None, network: str = DEFAULT_NETWORK,
              max_step_s: Optional[float] = None, rates: Optional[KernelRates] = None) -> Plan:
    """Plan ``recipe`` on ``gpus`` GPUs of ``gpu_memory_bytes`` each (0: CPU ranks, as the
    trainer's DS_ACCELERATOR=cpu), ``gpus_per_node`` per node with ``host_memory_bytes`` of host
    memory and ``cores`` usable cores each (defaults: DEFAULT_HOST_MEMORY and
    ASSUMED_CORES_PER_GPU per GPU, marked as assumed); ``encoder_tflops`` as
    timing.encoder_times. Raises RecipeError when the batch does not split over the GPUs and
    PlanError when the model cannot be estimated, or CPU ranks are asked for what only a GPU
    has (its decoder, a step-time budget); a recipe that does not fit gets ``fits == False``
    and a verdict that says why and what would fix it."""
    if network not in NETWORKS:
        raise PlanError(f"plan: network must be one of {list(NETWORKS)}, got {network!r}")
    if gpu_memory_bytes == 0:
        _check_cpu_ranks(recipe, max_step_s)
    rates = rates or KernelRates.load()
    assumed = host_memory_bytes is None
    host_memory_bytes = DEFAULT_HOST_MEMORY if assumed else host_memory_bytes
    sizes = RankSizes(gpu_memory_bytes, gpus_per_node, planned_cores(gpus, gpus_per_node, cores), host_memory_bytes)
    model = estimate(recipe.model.name)
    # what each rank will choose (training/resolve.py asks the same function)
    resolution = resolve_autos(recipe, gpus, sizes, rates=rates, model=model, network=network,
                               encoder_tflops=encoder_tflops)
    recipe = resolution.recipe
    probe = functools.partial(assess, gpu_memory_bytes=gpu_memory_bytes, gpus_per_node=gpus_per_node,
                              host_memory_bytes=host_memory_bytes, rates=rates, encoder_tflops=encoder_tflops,
                              network=network, max_step_s=max_step_s)
    plan = dataclasses.replace(probe(recipe, gpus, model=model), host_memory_assumed=assumed,
                               choices=resolution.choices, cores_assumed=cores is None)
    plan = dataclasses.replace(plan, unbinding=unbinding(plan, rates, network, encoder_tflops))
    if plan.fits and plan.on_cpu:
        return dataclasses.replace(plan, verdict=f"fits: {mem.gib(plan.host_bytes)} GiB of "
                                                 f"{mem.gib(host_memory_bytes)} GiB of host memory per node")
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
    remedies = _remedies(recipe, gpus, gpus_per_node, culprit, fits, plan.on_cpu)
    tried = ("ranks, chunk, checkpointing, ZeRO stage" if plan.on_cpu else
             "GPUs, chunk, checkpointing, ZeRO stage, offload")
    fix = " or ".join(remedies[:2]) or f"no single change of {tried}, workers or kept decoded chunks fits"
    return dataclasses.replace(plan, verdict=f"does not fit: {problem}; {fix}", remedies=tuple(remedies))


def _check_cpu_ranks(recipe: Recipe, max_step_s: Optional[float]) -> None:
    """What CPU ranks cannot do, refused as the trainer refuses it (training/resolve.py:
    check_decoder) and before planning: decode on a GPU, or be held to a step time the planner
    cannot model without GPU rates."""
    data = recipe.data
    if data.host_batch == "encoded" and data.decoder in ("nvjpeg", "hybrid"):
        raise PlanError(f"plan: data.decoder={data.decoder} decodes on the GPU and DS_ACCELERATOR=cpu runs the ranks "
                        "on their CPUs: use data.decoder=pil")
    if max_step_s is not None:
        raise PlanError("plan: --max-step-time: the step time of CPU ranks (DS_ACCELERATOR=cpu) is not modelled")


# More decode processes per rank than this is no advice: a node has a few dozen cores per GPU.
MAX_DECODE_WORKERS_ADVISED = 64


def unbinding(plan: Plan, rates: KernelRates, network: str = DEFAULT_NETWORK,
              encoder_tflops: Optional[float] = None) -> Tuple[str, ...]:
    """Where decoding makes the engine wait, each change that would shorten the wait, with the
    wait it leaves (plan/overlap.py): a larger window, more decode processes (cores), the GPU
    decoder. Empty where the engine does not wait."""
    d = plan.decoding
    if d is None or not d.binds:
        return ()
    recipe, local, image_size = plan.recipe, plan.local_batch, plan.model.image_size
    shape = d.overlap.shape
    ways = []
    row = 3 * image_size ** 2
    if d.overlap.window_binds:
        ways += _larger_windows(plan, row)
    if d.overlap.rate_binds and recipe.data.decoder != "nvjpeg":
        needed = d.workers_needed()
        if d.workers and needed > MAX_DECODE_WORKERS_ADVISED:
            ways.append(f"{needed:,} decode processes a rank would keep up, more than a node has cores: hold the "
                        "batch decoded (data.host_batch=decoded) or give each step more work")
        elif d.workers and needed > d.workers:
            ways.append(f"{needed} decode processes a rank ({needed - d.workers} more cores a rank) would keep up")
        if recipe.data.decoder in ("pil", "torchvision"):
            hybrid = _with_decoder(plan, "hybrid")
            if hybrid is not None and hybrid.wait_s < d.wait_s:
                ways.append(f"the GPU decoder beside the processes (data.decoder=hybrid) leaves "
                            f"{_wait_text(hybrid.wait_s)}")
    kept = shape.kept + shape.host_kept
    if shape.passes == 2 and kept < local and d.overlap.rate_binds:
        ways.append(f"{local - kept:,} rows are decoded twice a step: kept on the GPU (data.keep_decoded_gib) or "
                    f"in the decode pool's window (data.keep_decoded_host_gib), once")
    return tuple(ways)


def _larger_windows(plan: Plan, row: int) -> List[str]:
    """The window of each decoder that binds, at the size with which the step waits no longer
    than any larger window allows: the decode pool's in host memory (data.decode_window_gib), the
    GPU decoder's lane's on the GPU (data.gpu_decode_window_gib)."""
    d, recipe = plan.decoding, plan.recipe
    shape = d.overlap.shape
    decoders = step_decoders(recipe, plan.local_batch, plan.model.image_size, shape.host_kept)
    lane = len(decoders) - 1 if gpu_decode_share(recipe.data) > 0 else None
    alone = [window_needed(shape, decoders, which=which, floor=decoder.window)
             if which == lane or d.workers else decoder.window  # the training process holds no window
             for which, decoder in enumerate(decoders)]
    grown = [which for which, decoder in enumerate(decoders) if alone[which] > decoder.window]
    together = ""
    if not grown and len(decoders) > 1 and d.workers:  # only both windows grown together help
        alone = windows_needed_together(shape, decoders)
        grown = [which for which, decoder in enumerate(decoders) if alone[which] > decoder.window]
        together = " together"
    texts = []
    for which in grown:
        rows, held = alone[which], decoders[which].window
        if which == lane:
            more = (rows - held) * row
            room = plan.gpu_memory_bytes - plan.peak_gpu_bytes
            fits = "" if more <= room else f", more than the GPU leaves ({mem.gib(max(0, room))} GiB)"
            texts.append(f"a GPU decoder's window of {mem.gib(rows * row)} GiB (data.gpu_decode_window_gib; "
                         f"+{mem.gib(more)} GiB a GPU{fits})")
        else:
            more = (rows - held) * row * min(plan.gpus, plan.gpus_per_node)
            room = plan.host_memory_bytes * AUTO_WINDOW_HOST_SHARE - plan.host_bytes
            fits = "" if more <= room else f", more than the node's memory leaves ({mem.gib(max(0, room))} GiB)"
            texts.append(f"a window of {mem.gib(rows * row)} GiB a rank (data.decode_window_gib; "
                         f"+{mem.gib(more)} GiB per node{fits})")
    if together:
        return [" and ".join(texts) + f"{together} leave {_wait_text(d.overlap.bound_s)}"] if texts else []
    return [f"{text} leaves {_wait_text(d.overlap.bound_s)}" for text in texts]


def _with_decoder(plan: Plan, name: str) -> Optional[Decoding]:
    """The plan's decoding with another decoder (its processes and share resolved as `auto`
    would), or None where that is not a decoder for this recipe."""
    recipe = recipe_with(plan.recipe, "data", decoder=name)
    if name == "hybrid":
        recipe = recipe_with(recipe, "data", gpu_decode_share=hybrid_gpu_share(recipe.data))
    return decoding(recipe, plan.local_batch, plan.time, plan.decoding.overlap.shape.kept, plan.model.image_size)


def _wait_text(seconds: float) -> str:
    return "no wait" if seconds <= 0.01 else f"a wait of {seconds_text(seconds)} a step"


def _problem(plan: Plan) -> Tuple[str, str]:
    """(culprit, description) of the most exceeded limit."""
    limit = plan.limit(plan.binding)
    if limit.name == HOST_LIMIT and plan.on_cpu:  # the ranks' tensors are host memory: name the largest part
        part = max(plan.host, key=plan.host.get)
        return HOST_LIMIT, (f"host memory per node needs {mem.gib(limit.used)} GiB of {mem.gib(limit.capacity)} GiB "
                            f"({mem.gib(plan.host[part])} GiB of it {part})")
    if limit.name == HOST_LIMIT:
        inputs = plan.host[mem.INPUTS]
        return HOST_LIMIT, (f"host memory per node needs {mem.gib(limit.used)} GiB of {mem.gib(limit.capacity)} GiB "
                            f"({mem.gib(inputs)} GiB of input batches)")
    if limit.name == TIME_LIMIT:
        return TIME_LIMIT, f"a step takes {seconds_text(limit.used)}, over the {seconds_text(limit.capacity)} budget"
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


def _largest_below(value: int, fits: Callable[[int], bool]) -> Optional[int]:
    """The largest v in [1, value) with fits(v), for fits monotone (true below some point)."""
    lo, hi = 0, value  # fits(lo) is taken as true, fits(hi) as false
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo if lo >= 1 and fits(lo) else None


def _remedies(recipe: Recipe, gpus: int, gpus_per_node: int, culprit: str,
              fits: Callable[[Recipe, int], bool], on_cpu: bool = False) -> List[str]:
    """Single changes that make the recipe fit, those relevant to the culprit first (on CPU
    ranks, none that moves features between a GPU and the host)."""
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
                return f"use {ranks_text(n, on_cpu)}"

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
    if on_cpu:
        del candidates["offload"], candidates["no-offload"]
    relevant = [key for key in _RELEVANT.get(culprit, ()) if key in candidates]
    order = relevant + [key for key in candidates if key not in relevant]
    return [text for text in (candidates[key]() for key in order) if text]
