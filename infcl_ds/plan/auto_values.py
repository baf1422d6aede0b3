"""One plan resolves every `auto` of a recipe for the rank it will run on: the decoder, the decode
processes, the chunk, the rows kept decoded on the GPU between the passes and the decode
window, each with the reason, in one call (`resolve_autos`). The trainer asks it once per rank
(training/resolve.py) and `infcl-ds plan` once per plan (plan.make_plan), so both say the same.

They are chosen together, because each depends on the others:
- the decode processes are the cores of the rank's share less what else keeps cores busy;
- the chunk is a power of two whose GPU peak fits; among those that fit (down to
  AUTO_CHUNK_MIN), the largest whose planned step is as short as any: a smaller chunk leaves
  room on the GPU to keep more decoded rows for the grad pass, which can halve the decoding;
- the kept rows fill what the chunk's peak leaves of the GPU, in whole chunks;
- the decode window is the smallest with which the decode processes run through the whole
  step (plan/overlap.py), within what the node's memory leaves;
- the decoder (`auto`): pil where its processes keep the engine from waiting or the shards are
  not JPEG, else the GPU decoder where that makes the step shorter: alone (nvjpeg), or beside
  the processes (hybrid) where that is shorter still by HYBRID_MIN_GAIN.
"""
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from ..config import Recipe, check_world
from ..config.recipe import MAX_PROCESSES, DataSection
from ..data.decoding.decode_pool import DECODE_PIECE_ROWS, window_slots
from ..data.footprint import (LANE_WINDOW_GIB, gpu_decode_share, has_pool, hybrid_gpu_share, image_bytes_per_sample,
                              jpeg_share, kept_pixel_rows)
from ..engine.tower_footprint import ModelEstimate, UnmodelledModelError, estimate_model
from . import memory as mem
from .machine import CoreShare, split_cores
from .overlap import seconds_text, tolerance_s, window_needed, windows_needed_together
from .refusal import PlanError
from .timing import DEFAULT_NETWORK, Decoding, KernelRates, StepTime, decoding, step_decoders, step_shape, step_time

# batch.chunk: auto. Powers of two up to this: larger chunks make a step faster (measured:
# docs/planner.md), but past this they only add activation memory.
AUTO_CHUNK_MAX = 2048
# Below this the joint choice does not go for more kept rows: the towers' rates were measured at
# chunks of 256 and more, and smaller ones fill the GPU less.
AUTO_CHUNK_MIN = 256
# Share of the GPU's memory the planned peak may take at the chosen chunk: room for what the
# planner does not model (fragmentation beyond its reserve, other processes).
AUTO_CHUNK_MEMORY_SHARE = 0.9
# batch.chunk: auto without a GPU to plan for (the CPU tests and demos): the recipe default.
AUTO_CHUNK_CPU = 64
# data.keep_decoded_gib: auto on CPU ranks: host memory the kept chunks may take per rank.
AUTO_KEEP_CPU_GIB = 1.0
# data.decode_window_gib: auto on CPU ranks (no planned step to size it from).
AUTO_WINDOW_CPU_GIB = 1.0
# data.gpu_decode_window_gib: auto where the lane's window binds: this many larger windows tried,
# evenly from LANE_WINDOW_GIB to two local batches' share of the lane, each with the kept rows the
# rest of the GPU's room allows.
AUTO_LANE_TRIALS = 8
# Share of the node's memory the planned host total may reach with the auto decode windows: the
# page cache of the shards and what the planner does not count need the rest.
AUTO_WINDOW_HOST_SHARE = 0.85
# data.decoder: auto takes the GPU decoder beside the PIL processes (hybrid) over the GPU decoder
# alone only where its planned step is shorter by this share: the processes cost cores and memory.
HYBRID_MIN_GAIN = 0.01
# data.decoder: auto considers the GPU decoder only where at least this share of the shards' images
# are JPEG: the rest it hands to PIL in its lane's one thread (PNG shards, as the quickstart's digits).
MIN_JPEG_SHARE = 0.9
# data.decode_workers: auto where the node is not known: cores per GPU of a training node, on the
# low side (one H200 host here has 16; a DGX H100 has 224 logical cores for 8 GPUs).
ASSUMED_CORES_PER_GPU = 16


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
class RankSizes:
    """What a rank's `auto` values depend on: its GPU's memory (0: a CPU rank), the ranks on its
    node, its share of the node's cores and the node's memory."""
    gpu_memory_bytes: int
    gpus_per_node: int
    share: CoreShare
    host_memory_bytes: int


@dataclass(frozen=True)
class Choice:
    """One `auto` resolved: the recipe key, its value and why."""
    key: str
    value: object
    why: str = ""

    def text(self) -> str:
        value = f"{self.value:.3g}" if isinstance(self.value, float) else self.value
        return f"{self.key}={value}" + (f" ({self.why})" if self.why else "")


@dataclass(frozen=True)
class Resolution:
    """A recipe with every `auto` resolved for one rank, the choices it made (the keys the recipe
    left `auto`) and, on a GPU rank with encoded host batches, the planned step's decoding."""
    recipe: Recipe
    choices: Tuple[Choice, ...]
    decoding: Optional[Decoding] = None
    time: Optional[StepTime] = None

    def choice(self, key: str) -> Optional[Choice]:
        return next((c for c in self.choices if c.key == key), None)

    def line(self) -> str:
        """Every choice in one line ("" where the recipe left nothing `auto`)."""
        return "auto: " + "; ".join(c.text() for c in self.choices) if self.choices else ""


def recipe_with(recipe: Recipe, section: str, **changes) -> Recipe:
    """A copy of `recipe` with keys of one section changed (no validation: the planner's probes)."""
    return recipe.model_copy(update={section: getattr(recipe, section).model_copy(update=changes)})


def estimate(name: str) -> ModelEstimate:
    """The towers' footprint of model ``name`` as the engine states it
    (engine/tower_footprint.py), a model it does not model refused as a PlanError."""
    try:
        return estimate_model(name)
    except UnmodelledModelError as err:
        raise PlanError(f"plan: {err}") from err


def planned_cores(gpus: int, gpus_per_node: int, cores: Optional[int] = None) -> CoreShare:
    """A rank's share of a node's `cores` (ASSUMED_CORES_PER_GPU per rank where None), the
    node's ranks splitting them: what each rank of the launch will find (machine.rank_cores)."""
    ranks = min(gpus, gpus_per_node)
    return split_cores(ASSUMED_CORES_PER_GPU * ranks if cores is None else cores, ranks, "each rank's share",
                       "on a node")


def busy_besides_decoding(data: DataSection) -> List[Tuple[int, str]]:
    """(cores, in words) of each thing that else stays busy on a rank while its decode processes
    run: the training process (it drives the GPU and assembles the next batch), the data.workers
    readers together one core (each step they read a local batch's stored bytes and tokenize its
    captions: tens of microseconds a sample, against milliseconds to decode it) and, for
    data.decoder=hybrid, the GPU decoder's lane threads (each drives nvJPEG: a core each, its
    calls wait busily beside training, docs/benchmarks/decode_variants.json). Decode processes
    beyond the cores these leave would only take turns with them and with each other."""
    busy = [(1, "the training process")]
    if data.workers:
        busy.append((1, f"{data.workers} reader{'s' if data.workers > 1 else ''} (one core)"))
    if data.decoder == "hybrid":
        lanes = data.gpu_decode_lanes
        busy.append((lanes, f"the GPU decoder's {f'{lanes} lane threads' if lanes > 1 else 'lane thread'}"))
    return busy


def in_words(items: Sequence[str]) -> str:
    """"a", "a and b", "a, b and c"."""
    return ", ".join(items[:-1]) + (" and " if len(items) > 1 else "") + items[-1] if items else ""


def auto_decode_workers(data: DataSection, share: CoreShare) -> AutoDecodeWorkers:
    """`data.decode_workers: auto` on a rank with `share` of its node's cores: the cores left by
    busy_besides_decoding, at most MAX_PROCESSES. At least 1 where the share has 2 cores or
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
    busy = busy_besides_decoding(data)
    left, words = share.cores - sum(n for n, _ in busy), in_words([text for _, text in busy])
    count = min(max(1, left), MAX_PROCESSES)
    bound = ("; at least 1, so that decoding overlaps the step" if left < 1 else
             f"; at most {MAX_PROCESSES:,}" if left > MAX_PROCESSES else "")
    return AutoDecodeWorkers(count, f"{share.text}, less {words}{bound}")


# -- the GPU's memory: chunk and kept rows ------------------------------------------------------

def _budget(sizes: RankSizes) -> int:
    return int(sizes.gpu_memory_bytes * AUTO_CHUNK_MEMORY_SHARE)


def _chunks_that_fit(recipe: Recipe, gpus: int, model: ModelEstimate, sizes: RankSizes) -> List[int]:
    """`batch.chunk: auto`'s candidates, largest first: powers of two (and the local batch where
    it is smaller than AUTO_CHUNK_MAX) whose peak, nothing kept, fits AUTO_CHUNK_MEMORY_SHARE of
    the GPU, from the largest down to AUTO_CHUNK_MIN. A PlanError where even 1 does not fit."""
    local = recipe.local_batch(gpus)
    top = min(local, AUTO_CHUNK_MAX)
    candidates = [top] + [1 << k for k in range(top.bit_length() - 1, -1, -1) if (1 << k) < top]
    bare = recipe_with(recipe, "data", keep_decoded_gib=0.0)
    fitting = []
    for chunk in candidates:
        peak = mem.gpu_memory(model, recipe_with(bare, "batch", chunk=chunk), gpus).peak
        if peak <= _budget(sizes):
            fitting.append(chunk)
            if chunk <= AUTO_CHUNK_MIN:
                break
    if not fitting:
        raise PlanError(f"batch.chunk=auto: not even a chunk of 1 fits {AUTO_CHUNK_MEMORY_SHARE:.0%} of "
                        f"{sizes.gpu_memory_bytes / mem.GIB:.4g} GiB per GPU (planned peak {mem.gib(peak)} GiB)")
    return fitting


def _auto_keep_gib(recipe: Recipe, gpus: int, model: ModelEstimate, sizes: RankSizes) -> float:
    """`data.keep_decoded_gib: auto` at the recipe's (numeric) chunk: the decoded pixels of as
    many whole chunks of the local batch (all of them where they fit) as the planned peak leaves
    room for within AUTO_CHUNK_MEMORY_SHARE of the GPU; 0 when none fit."""
    bare = mem.gpu_memory(model, recipe_with(recipe, "data", keep_decoded_gib=0.0), gpus).peak
    row = 3 * model.image_size ** 2
    local = recipe.local_batch(gpus)
    rows = min(local, max(0, _budget(sizes) - bare) // row)
    rows = rows if rows == local else rows - rows % recipe.batch.chunk
    return rows * row / mem.GIB  # exact: kept_rows gives `rows` back


# -- the host: the decode window ----------------------------------------------------------------

def _window_room_rows(recipe: Recipe, gpus: int, model: ModelEstimate, sizes: RankSizes, image_bytes: int) -> int:
    """Decoded rows a rank's window may hold within AUTO_WINDOW_HOST_SHARE of its node's memory,
    beside everything else the node holds (its ranks' input batches, reserves, offloaded
    features and the smallest windows)."""
    smallest = recipe_with(recipe, "data", decode_window_gib=1e-9)
    others = sum(mem.host_memory(model, smallest, gpus, sizes.gpus_per_node, image_bytes).values())
    ranks = min(gpus, sizes.gpus_per_node)
    room = int(sizes.host_memory_bytes * AUTO_WINDOW_HOST_SHARE) - others
    return max(0, room) // (ranks * 3 * model.image_size ** 2)


def _auto_window(recipe: Recipe, gpus: int, model: ModelEstimate, sizes: RankSizes, time: StepTime, kept: int,
                 image_bytes: int) -> Tuple[float, str]:
    """`data.decode_window_gib: auto` (every other key resolved): the smallest window with which
    the decode processes run through the whole step (plan/overlap.py's window_needed), at most
    what the node's memory leaves (_window_room_rows), and why."""
    row = 3 * model.image_size ** 2
    data = recipe.data
    local = recipe.local_batch(gpus)
    shape = step_shape(recipe, local, time, kept, model.image_size)
    if not has_pool(data) or (gpu_decode_share(data) >= 1 and not shape.host_kept):
        return DECODE_PIECE_ROWS * row / mem.GIB, "no decode processes"
    probe = recipe_with(recipe, "data", decode_window_gib=1e-9)
    decoders = step_decoders(probe, local, model.image_size, shape.host_kept)
    # at least two pieces per process beyond the rows kept between the passes: every process busy
    least = window_slots(0, data.decode_workers) * DECODE_PIECE_ROWS
    floor = shape.host_kept + least
    need = window_needed(shape, decoders, which=0, floor=floor) - shape.host_kept  # rows decoded ahead
    room = _window_room_rows(recipe, gpus, model, sizes, image_bytes)
    if need > room:
        rows = max(room, least)
        why = (f"{rows:,} rows: capped by the node's memory, {mem.gib(sizes.host_memory_bytes)} GiB; the decode "
               f"processes would need {need:,} rows ({mem.gib(need * row)} GiB) to run through the whole step")
    else:
        rows = max(need, least)
        why = f"{rows:,} rows, with which the decode processes run through the whole step"
    return rows * row / mem.GIB, why


def _auto_host_keep(recipe: Recipe, gpus: int, model: ModelEstimate, sizes: RankSizes, kept: int,
                    image_bytes: int, time: StepTime, balance: bool = False) -> Tuple[float, str]:
    """`data.keep_decoded_host_gib: auto` (the chunk and the GPU's kept rows resolved): every row
    of the local batch the GPU does not keep (with `hybrid`, chunks the processes then decode
    alone), in whole chunks, where the node's memory allows
    beside everything else; where it does not hold those and an `auto` window too, the share of
    them whose steady step waits least with the window the rest of the memory gives (rows
    decoded once against rows decoded ahead), the larger on a tie; with `balance` (`hybrid`'s
    share `auto`), each at the better of its share and the one that balances its decoders
    (_balanced_share). And why."""
    data, local, chunk = recipe.data, recipe.local_batch(gpus), recipe.batch.chunk
    if not has_pool(data):
        return 0.0, "no decode processes"
    if -(-local // chunk) == 1 and recipe.zero.stage < 3 and not recipe.batch.offload_features:
        return 0.0, "one pass"
    rest = local - min(kept, local)
    if not rest:
        return 0.0, "the GPU keeps every row"
    row = 3 * model.image_size ** 2
    bare = recipe_with(recipe, "data", keep_decoded_host_gib=0.0)
    room = _window_room_rows(bare, gpus, model, sizes, image_bytes)

    def whole(rows: int) -> int:
        return rows if rows >= rest else rows - rows % chunk
    rows = whole(min(rest, room))
    if data.decode_window_gib == "auto" and rows:
        least = window_slots(0, data.decode_workers) * DECODE_PIECE_ROWS

        def wait(kept_rows: int) -> float:
            trial = recipe_with(bare, "data", keep_decoded_host_gib=kept_rows * row / mem.GIB,
                                decode_window_gib=max(room - kept_rows, least) * row / mem.GIB)
            plain = decoding(trial, local, time, kept, model.image_size).wait_s
            if not balance:
                return plain
            balanced = recipe_with(trial, "data", gpu_decode_share=_balanced_share(trial, local, time, kept,
                                                                                   model.image_size))
            return min(plain, decoding(balanced, local, time, kept, model.image_size).wait_s)
        waits = {h: wait(h) for h in sorted({whole(rows * i // 8) for i in range(9)}, reverse=True)}
        shortest = min(waits.values())
        best = next(h for h, w in waits.items() if w <= shortest + tolerance_s(step_shape(bare, local, time, kept,
                                                                                          model.image_size)))
        if best < rows:
            return best * row / mem.GIB, (f"{best:,} of the {rest:,} rows the GPU does not keep: the node's memory "
                                          f"leaves the rest to the decode window")
    why = (f"the {rows:,} rows the GPU does not keep" if rows == rest else
           f"{rows:,} of the {rest:,} rows the GPU does not keep: the node's memory allows no more")
    return rows * row / mem.GIB, why


# -- one decoder's plan -------------------------------------------------------------------------

@dataclass(frozen=True)
class _Candidate:
    recipe: Recipe
    choices: Tuple[Choice, ...]
    decoding: Optional[Decoding]
    time: StepTime

    @property
    def step_s(self) -> float:
        return self.time.total + (self.decoding.wait_s if self.decoding else 0.0)


def _kept(recipe: Recipe, gpus: int, model: ModelEstimate) -> int:
    return kept_pixel_rows(recipe.data, recipe.local_batch(gpus), model.image_size, recipe.batch.chunk)


def _plan_decoder(recipe: Recipe, gpus: int, model: ModelEstimate, sizes: RankSizes, rates: KernelRates,
                  network: str, encoder_tflops: Optional[float], image_bytes: int) -> _Candidate:
    """The recipe (its decoder named) with its other `auto` values resolved together."""
    choices: List[Choice] = []
    data = recipe.data
    if data.decode_workers == "auto":
        workers = auto_decode_workers(data, sizes.share)
        recipe = recipe_with(recipe, "data", decode_workers=workers.count)
        choices.append(Choice("data.decode_workers", workers.count, workers.why))
    if recipe.data.decoder == "hybrid" and recipe.data.gpu_decode_share == "auto":
        share = hybrid_gpu_share(recipe.data)
        recipe = recipe_with(recipe, "data", gpu_decode_share=share)
        choices.append(Choice("data.gpu_decode_share", round(share, 4), "the GPU's rate over both decoders'"))
    lane_auto = recipe.data.gpu_decode_window_gib == "auto"
    if lane_auto:  # the chunk is chosen with the smallest; a larger window is weighed after
        recipe = recipe_with(recipe, "data", gpu_decode_window_gib=LANE_WINDOW_GIB)
    chunks = [recipe.batch.chunk] if recipe.batch.chunk != "auto" else _chunks_that_fit(recipe, gpus, model, sizes)
    args = (gpus, model, sizes, rates, network, encoder_tflops, image_bytes)
    best = None
    for chunk in chunks:
        candidate = _at_chunk(recipe, chunk, choices, *args)
        # the largest chunk whose step is as short as any: a smaller one must save time to win
        if best is None or candidate.step_s < best.step_s - _tolerance(candidate, gpus, model):
            best = candidate
    if lane_auto and gpu_decode_share(recipe.data) > 0 and recipe.data.host_batch == "encoded":
        best = _auto_lane_window(recipe, best, *args)
    return best


def _tolerance(candidate: _Candidate, gpus: int, model: ModelEstimate) -> float:
    r = candidate.recipe
    return tolerance_s(step_shape(r, r.local_batch(gpus), candidate.time, _kept(r, gpus, model), model.image_size))


def _at_chunk(recipe: Recipe, chunk: int, choices: List[Choice], gpus: int, model: ModelEstimate, sizes: RankSizes,
              rates: KernelRates, network: str, encoder_tflops: Optional[float], image_bytes: int) -> _Candidate:
    """The recipe at `chunk` with its kept rows, host-kept rows and decode window resolved."""
    local = recipe.local_batch(gpus)
    trial, trial_choices = recipe_with(recipe, "batch", chunk=chunk), list(choices)
    if recipe.batch.chunk == "auto":
        trial_choices.append(Choice("batch.chunk", chunk))
    if trial.data.keep_decoded_gib == "auto":
        gib = _auto_keep_gib(trial, gpus, model, sizes) if trial.data.host_batch == "encoded" else 0.0
        trial = recipe_with(trial, "data", keep_decoded_gib=gib)
        kept = _kept(trial, gpus, model)
        trial_choices.append(Choice("data.keep_decoded_gib", gib,
                                    f"{kept:,} of {local:,} rows" if kept < local else f"all {local:,} rows"))
    time = step_time(model, trial, gpus, rates, sizes.gpus_per_node, network, encoder_tflops)
    kept = _kept(trial, gpus, model)
    share_auto = next((i for i, c in enumerate(trial_choices) if c.key == "data.gpu_decode_share"), None)
    if trial.data.keep_decoded_host_gib == "auto":
        gib, why = (_auto_host_keep(trial, gpus, model, sizes, kept, image_bytes, time,
                                    balance=share_auto is not None)
                    if trial.data.host_batch == "encoded" else (0.0, "decoded host batches"))
        trial = recipe_with(trial, "data", keep_decoded_host_gib=gib)
        trial_choices.append(Choice("data.keep_decoded_host_gib", gib, why))
    candidate = _with_window(trial, trial_choices, time, gpus, model, sizes, kept, image_bytes)
    if share_auto is not None and candidate.decoding is not None and candidate.decoding.overlap.shape.host_kept:
        # the chunks the pool keeps are the processes' alone: a larger GPU share of the others,
        # where it fits and makes the step shorter
        balanced, balanced_time, choice = _balanced_hybrid(trial, gpus, model, rates, sizes.gpus_per_node, network,
                                                           encoder_tflops, time, kept)
        if mem.gpu_memory(model, balanced, gpus).peak <= _budget(sizes):
            balanced_choices = list(trial_choices)
            balanced_choices[share_auto] = choice
            other = _with_window(balanced, balanced_choices, balanced_time, gpus, model, sizes, kept, image_bytes)
            if other.step_s < candidate.step_s - _tolerance(other, gpus, model):
                candidate = other
    return candidate


def _with_window(trial: Recipe, choices: List[Choice], time: StepTime, gpus: int, model: ModelEstimate,
                 sizes: RankSizes, kept: int, image_bytes: int) -> _Candidate:
    """The candidate with its decode window resolved and its decoding planned."""
    local, choices = trial.local_batch(gpus), list(choices)
    if trial.data.decode_window_gib == "auto":
        gib, why = (_auto_window(trial, gpus, model, sizes, time, kept, image_bytes)
                    if trial.data.host_batch == "encoded" else (AUTO_WINDOW_CPU_GIB, "decoded host batches"))
        trial = recipe_with(trial, "data", decode_window_gib=gib)
        choices.append(Choice("data.decode_window_gib", gib, why))
    planned = (decoding(trial, local, time, kept, model.image_size)
               if trial.data.host_batch == "encoded" else None)
    return _Candidate(trial, tuple(choices), planned, time)


def _balanced_share(recipe: Recipe, local: int, time: StepTime, kept: int, image_size: int) -> float:
    """`hybrid`'s GPU share with which both decoders are busy alike over the recipe's step, the
    chunks its decode pool keeps between the passes the processes' alone."""
    shape = step_shape(recipe, local, time, kept, image_size)
    return hybrid_gpu_share(recipe.data, shape.decodes, shape.host_kept)


def _balanced_hybrid(recipe: Recipe, gpus: int, model: ModelEstimate, rates: KernelRates, gpus_per_node: int,
                     network: str, encoder_tflops: Optional[float], time: StepTime,
                     kept: int) -> Tuple[Recipe, StepTime, Choice]:
    """`hybrid` at the share that balances its decoders once the rows kept on the host are known
    (the chunks the decode pool keeps are the processes' alone, so the GPU takes more of the
    others: footprint.hybrid_gpu_share), with the step's time again (the towers' slowdown beside
    the GPU decoder follows its share), and the choice that says so."""
    shape = step_shape(recipe, recipe.local_batch(gpus), time, kept, model.image_size)
    share = hybrid_gpu_share(recipe.data, shape.decodes, shape.host_kept)
    recipe = recipe_with(recipe, "data", gpu_decode_share=share)
    time = step_time(model, recipe, gpus, rates, gpus_per_node, network, encoder_tflops)
    return recipe, time, Choice("data.gpu_decode_share", round(share, 4),
                                f"both decoders busy alike, the {shape.host_kept:,} rows kept in the decode pool's "
                                f"window the processes' alone")


def _lane_binds(candidate: _Candidate, gpus: int, model: ModelEstimate) -> bool:
    """Whether the GPU decoder's window is among those that bind: grown alone, or with the
    others, it must be larger for the step to wait less (plan/overlap.py)."""
    r = candidate.recipe
    shape = candidate.decoding.overlap.shape
    decoders = step_decoders(r, r.local_batch(gpus), model.image_size, shape.host_kept)
    lane = decoders[-1]
    return (window_needed(shape, decoders, which=len(decoders) - 1, floor=lane.window) > lane.window
            or windows_needed_together(shape, decoders)[-1] > lane.window)


def _auto_lane_window(recipe: Recipe, best: _Candidate, gpus: int, model: ModelEstimate, sizes: RankSizes,
                      rates: KernelRates, network: str, encoder_tflops: Optional[float],
                      image_bytes: int) -> _Candidate:
    """`data.gpu_decode_window_gib: auto` at the chosen chunk: LANE_WINDOW_GIB, or where the step
    waits with the window binding, the larger window (up to two local batches' share of the lane,
    AUTO_LANE_TRIALS of them) whose step, with the kept rows the rest of the GPU's room allows
    and the decode window that goes with them, is shortest; the smaller on a tie."""
    row = 3 * model.image_size ** 2
    local, chunk = recipe.local_batch(gpus), best.recipe.batch.chunk
    chosen, gib, why = best, LANE_WINDOW_GIB, "the smallest: a larger one would not shorten the step"
    if best.decoding is not None and best.decoding.overlap.window_binds and _lane_binds(best, gpus, model):
        # up to two local batches' share of the lane, and no more than the GPU's room with no rows kept
        bare = (recipe_with(best.recipe, "data", keep_decoded_gib=0.0) if recipe.data.keep_decoded_gib == "auto"
                else best.recipe)  # a kept size the recipe sets stays
        room = max(0, _budget(sizes) - mem.gpu_memory(model, bare, gpus).peak) / mem.GIB
        top = min(2 * local * gpu_decode_share(best.recipe.data) * row / mem.GIB, LANE_WINDOW_GIB + room)
        # made before the chunk's: the rest are made again for each window
        prior = [c for c in best.choices if c.key in ("data.decode_workers", "data.gpu_decode_share")]
        for i in range(1, AUTO_LANE_TRIALS + 1):
            trial_gib = round(LANE_WINDOW_GIB + (top - LANE_WINDOW_GIB) * i / AUTO_LANE_TRIALS, 3)
            if trial_gib <= LANE_WINDOW_GIB:
                break
            lane = recipe_with(recipe, "data", gpu_decode_window_gib=trial_gib)
            trial = _at_chunk(lane, chunk, prior, gpus, model, sizes, rates, network, encoder_tflops, image_bytes)
            if mem.gpu_memory(model, trial.recipe, gpus).peak > _budget(sizes):
                break  # the larger ones fit no better
            if trial.step_s < chosen.step_s - _tolerance(trial, gpus, model):
                chosen, gib = trial, trial_gib
        if chosen is not best:
            source = ("the rows kept on the GPU" if recipe.data.keep_decoded_gib == "auto"
                      else "the GPU's room beside the rows the recipe keeps")
            why = (f"the step waits {seconds_text(chosen.decoding.wait_s)} for decoded rows instead of "
                   f"{seconds_text(best.decoding.wait_s)}, the window taken from {source}")
    chosen_recipe = recipe_with(chosen.recipe, "data", gpu_decode_window_gib=gib)
    return _Candidate(chosen_recipe, chosen.choices + (Choice("data.gpu_decode_window_gib", gib, why),),
                      chosen.decoding, chosen.time)


def _decoder_why(pil: _Candidate) -> str:
    d = pil.decoding
    return (f"{d.workers} PIL processes decode {d.available:,.0f} samples/s of the {d.needed:,.0f} a "
            f"{seconds_text(pil.time.total)} step needs")


def resolve_autos(recipe: Recipe, gpus: int, sizes: RankSizes, *, rates: Optional[KernelRates] = None,
                  model: Optional[ModelEstimate] = None, network: str = DEFAULT_NETWORK,
                  encoder_tflops: Optional[float] = None) -> Resolution:
    """Every `auto` of `recipe` resolved for a rank of a job of `gpus` ranks with `sizes`: one
    plan. A CPU rank (no GPU memory) gets the CPU defaults. Raises RecipeError where the batch
    does not split over the ranks and PlanError where the model cannot be planned or no chunk
    fits."""
    check_world(recipe, gpus)
    if not sizes.gpu_memory_bytes:
        return _resolve_on_cpu(recipe, gpus, sizes)
    model = model or estimate(recipe.model.name)
    rates = rates or KernelRates.load()
    image_bytes = image_bytes_per_sample(recipe.data)[0] if recipe.data.host_batch == "encoded" else 0
    plan = lambda r: _plan_decoder(r, gpus, model, sizes, rates, network, encoder_tflops, image_bytes)  # noqa: E731
    data = recipe.data
    if data.decoder != "auto":
        chosen, decoder = plan(recipe), None
    elif data.host_batch == "decoded":
        chosen = plan(recipe_with(recipe, "data", decoder="pil"))
        decoder = Choice("data.decoder", "pil", "data.host_batch=decoded: the data workers decode, with PIL")
    elif (share := jpeg_share(data)) is not None and share < MIN_JPEG_SHARE:
        chosen = plan(recipe_with(recipe, "data", decoder="pil"))
        decoder = Choice("data.decoder", "pil", f"{share:.0%} of the first shard's images are JPEG: the GPU "
                                                "decoder takes JPEGs only")
    else:
        pil = plan(recipe_with(recipe, "data", decoder="pil"))
        if not pil.decoding.binds:
            chosen = pil
            decoder = Choice("data.decoder", "pil", f"{_decoder_why(pil)}: they keep up, with open_clip's pixels "
                                                    "exactly")
        else:
            # the GPU decoder alone, or beside the processes where that is clearly shorter
            hybrid, alone = (plan(recipe_with(recipe, "data", decoder=d)) for d in ("hybrid", "nvjpeg"))
            gpu = hybrid if hybrid.step_s < alone.step_s * (1 - HYBRID_MIN_GAIN) else alone
            if gpu is alone and hybrid.step_s < pil.step_s <= alone.step_s:
                gpu = hybrid  # shorter than PIL's where the GPU decoder alone is not
            faster = gpu.step_s < pil.step_s
            chosen = gpu if faster else pil
            how = (f"the GPU decodes every row ({seconds_text(alone.step_s)} a step; "
                   f"{seconds_text(hybrid.step_s)} with them beside it)" if gpu is alone
                   else "the GPU decodes a share of each chunk beside them")
            decoder = Choice("data.decoder", chosen.recipe.data.decoder,
                             f"{_decoder_why(pil)}: " + (how if faster else "the GPU decoder would not shorten the step"))
    choices = ((decoder,) if decoder else ()) + chosen.choices
    return Resolution(chosen.recipe, choices, chosen.decoding, chosen.time)


def _resolve_on_cpu(recipe: Recipe, gpus: int, sizes: RankSizes) -> Resolution:
    """A CPU rank: PIL, the CPU defaults of the chunk, kept rows and window (no GPU rates to plan
    a step with), decode processes from its cores."""
    choices = []
    data = recipe.data
    if data.decoder == "auto":
        recipe = recipe_with(recipe, "data", decoder="pil")
        choices.append(Choice("data.decoder", "pil", "no GPU on this rank"))
    if data.decode_workers == "auto":
        workers = auto_decode_workers(recipe.data, sizes.share)
        recipe = recipe_with(recipe, "data", decode_workers=workers.count)
        choices.append(Choice("data.decode_workers", workers.count, workers.why))
    if recipe.batch.chunk == "auto":
        chunk = min(AUTO_CHUNK_CPU, recipe.local_batch(gpus))
        recipe = recipe_with(recipe, "batch", chunk=chunk)
        choices.append(Choice("batch.chunk", chunk, "a CPU rank"))
    for key, value in (("keep_decoded_gib", AUTO_KEEP_CPU_GIB), ("keep_decoded_host_gib", 0.0),
                       ("decode_window_gib", AUTO_WINDOW_CPU_GIB)):
        if getattr(recipe.data, key) == "auto":
            recipe = recipe_with(recipe, "data", **{key: value})
            choices.append(Choice(f"data.{key}", value, "a CPU rank"))
    return Resolution(recipe, tuple(choices))

