"""The plan and the ring scaling table as text (what `infcl-ds plan` prints). A plan for CPU
ranks (Plan.on_cpu) speaks of ranks, their cores and host memory: nothing of GPUs they do not
have, nor of a step time the planner cannot model without GPU rates."""
from typing import List, Sequence

from ..data.footprint import input_samples_held, sample_host_bytes
from ..engine.tower_footprint import CALIBRATION_SOURCE, activation_calibration
from . import memory as mem
from .overlap import seconds_text
from .plan import GPU_LIMIT, HOST_LIMIT, Plan
from .auto_values import ASSUMED_CORES_PER_GPU
from .timing import NETWORKS, NVLINK, KernelRates, ScalingRow, min_hidden_block


def count(n: int) -> str:
    """1048576 -> '1M', 262144 -> '256k', 1000 -> '1000'."""
    for unit, size in (("M", 1 << 20), ("k", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def _header(plan: Plan) -> str:
    r, m = plan.recipe, plan.model
    nodes = -(-plan.gpus // plan.gpus_per_node)
    layout = f"{nodes} node{'s' if nodes > 1 else ''} x {min(plan.gpus, plan.gpus_per_node)}"
    if plan.on_cpu:
        layout += f"; DS_ACCELERATOR=cpu: {'over gloo' if plan.gpus > 1 else 'one process'}"
        features = "in host memory"
    else:
        features = "offloaded to host" if r.batch.offload_features else "on the GPU"
    return (f"plan: {m.name} ({m.params / 1e6:.1f}M parameters, D={m.embed_dim}), {r.precision.dtype}, "
            f"ZeRO-{r.zero.stage}, {plan.ranks_text()} ({layout})\n"
            f"batch: global {r.batch.global_size:,} = {plan.local_batch:,} per {'rank' if plan.on_cpu else 'GPU'}, "
            f"chunk {r.batch.chunk}, activation checkpointing {'on' if r.model.grad_checkpointing else 'off'}, "
            f"cached features {features}")


# What a CPU rank does not hold: the CUDA runtime, the GPU decoder's window.
_GPU_ONLY = (mem.RUNTIME, mem.DEVICE_WINDOW)


def _gpu_table(plan: Plan) -> List[str]:
    """Memory per GPU by component and phase; on CPU ranks the same tensors, held in host memory."""
    gpu = plan.gpu
    phases = list(gpu.phases)
    shown = [name for name in gpu.components if not (plan.on_cpu and name in _GPU_ONLY)]
    width = max(28, *(len(name) for name in shown))
    title = "per-rank tensors, in host memory (GiB)" if plan.on_cpu else "per-GPU memory (GiB)"
    lines = [f"{title:<{width + 2}}" + "".join(f"{p:>14}" for p in phases)]
    for name in shown:
        cells = "".join(f"{mem.gib(gpu.components[name]) if name in gpu.phases[p] else '-':>14}" for p in phases)
        lines.append(f"  {name:<{width}}{cells}")
    totals = [sum(gpu.components[n] for n in gpu.phases[p] if n in shown) for p in phases]
    lines.append(f"  {'total':<{width}}" + "".join(f"{mem.gib(total):>14}" for total in totals))
    factor, measured = activation_calibration(plan.model.name, plan.recipe.model.grad_checkpointing)
    calibration = (f"x{factor:.4f} fitted to {CALIBRATION_SOURCE}" if measured else
                   f"x{factor:.4f}, ViT-B-16's factor, transferred (checked within 4% on ViT-L-14 chunk 128, "
                   "ViT-B-16 with checkpointing and ZeRO-3: docs/planner.md)")
    if plan.on_cpu:
        lines.append(f"peak: {gpu.peak_phase}; {gpu.allocated_peak / 2**20:,.0f} MiB a rank, counted in the host "
                     f"memory below; activations: counted {calibration}")
        return lines
    lines.append(f"peak: {gpu.peak_phase}; allocated through torch {gpu.allocated_peak / 2**20:,.0f} MiB (what "
                 f"torch.cuda.max_memory_allocated reads) + runtime reserve {mem.gib(gpu.components[mem.RUNTIME])} "
                 f"GiB (measured on H200 with expandable segments); activations: counted {calibration}")
    return lines


def _auto_line(plan: Plan, cores_note: str = "") -> str:
    """What the recipe's `auto` values become on the planned nodes, each with why, in one line
    (plan/auto_values.py: each rank resolves them alike at start-up), and where the node's cores came
    from ("" where the recipe leaves nothing auto)."""
    if not plan.choices:
        return ""
    note = cores_note or (f"assumed {ASSUMED_CORES_PER_GPU} cores per {'rank' if plan.on_cpu else 'GPU'}; pass "
                          "--cores" if plan.cores_assumed else "")
    texts = [f"{c.key}={c.value} ({c.why}; {note})" if c.key == "data.decode_workers" and note else c.text()
             for c in plan.choices]
    return f"\n  auto: {'; '.join(texts)}"


def _decoding_lines(plan: Plan) -> str:
    """The decoders against the step (plan/overlap.py): their rates, the rows a step decodes, the
    window, the wait of a steady step; where the engine waits, what would shorten it."""
    d = plan.decoding
    if d is None:
        return ""
    shape = d.overlap.shape
    kept, on_host, local = min(shape.kept, plan.local_batch), shape.host_kept, plan.local_batch
    where = " and ".join(([f"{kept:,} on the GPU"] if kept else []) + ([f"{on_host:,} in the decode pool's window"]
                                                                      if on_host else []))
    twice = ("each row once (one pass)" if shape.passes == 1 else
             f"each row once (kept decoded between the passes: {where})" if kept + on_host >= local else
             f"each row in both passes but the {where} kept decoded" if where else "each row twice")
    decoder = plan.recipe.data.decoder
    sources = []
    if d.workers:
        held = f", {on_host:,} of them kept between the passes" if on_host else ""
        sources.append(f"{d.workers} decode processes at the measured {d.per_worker:,.0f} per process, their window "
                       f"{mem.gib(d.window_rows * 3 * plan.model.image_size ** 2)} GiB ({d.window_rows:,} rows{held})")
    elif decoder != "nvjpeg":
        sources.append(f"the training process at the measured {d.per_worker:,.0f} (no decode processes: nothing "
                       "decoded ahead)")
    if d.device_rate:
        lanes = plan.recipe.data.gpu_decode_lanes
        sources.append(f"the GPU's decoder{f' ({lanes} lanes)' if lanes > 1 else ''} at the measured "
                       f"{d.device_rate:,.0f}")
    text = (f"\n  decoding: {d.decodes:,} rows a step ({twice}), {d.needed:,.0f}/s to keep up with the compute; "
            f"{d.available:,.0f}/s from {' and '.join(sources)}")
    if not d.binds:
        return text + "; a steady step waits for none"
    o = d.overlap
    cause = ("the decoders are too slow for the step" if o.rate_binds and not o.window_binds else
             "the window is too small to carry the grad pass's decoding into the next step" if not o.rate_binds else
             "the decoders are too slow and the window too small")
    text += (f"\n  decoding binds: a steady step waits {seconds_text(o.wait_s)} for decoded rows ({cause}): "
             f"{seconds_text(plan.step_seconds)} instead of {seconds_text(plan.time.total)}")
    return text + "".join(f"\n    - {way}" for way in plan.unbinding)


def _host_line(plan: Plan, host_memory_note: str = "", cores_note: str = "") -> str:
    ranks = min(plan.gpus, plan.gpus_per_node)
    data = plan.recipe.data
    pieces = input_samples_held(data, plan.local_batch) - 2 * plan.local_batch
    parts = ", ".join(f"{name} {mem.gib(nbytes)}" for name, nbytes in plan.host.items())
    note = host_memory_note or ("assumed; pass --host-memory" if plan.host_memory_assumed else "")
    assumed = f" ({note})" if note else ""
    per_sample = sample_host_bytes(data, plan.model.image_size, plan.model.context_length, plan.image_bytes)
    if data.host_batch == "encoded":
        form = (f"{per_sample:,} B per sample held encoded "
                f"(image {plan.image_bytes:,} B, {plan.image_bytes_source}; tokens; row table)")
    else:
        form = f"{per_sample:,} B per sample held decoded (uint8 pixels, tokens)"
    lines = (f"host memory per node (GiB): {parts}; total {mem.gib(plan.host_bytes)} of "
             f"{mem.gib(plan.host_memory_bytes)}{assumed}\n"
             f"  inputs: {ranks} ranks x (2 local batches of {plan.local_batch:,}: training + assembled ahead; "
             f"{pieces:,} samples prefetched by {data.workers} data workers) x {form}")
    return lines + _auto_line(plan, cores_note) + _decoding_lines(plan)


def _time_lines(plan: Plan) -> List[str]:
    if plan.on_cpu:
        return ["step time: not modelled on CPU ranks (the planner's encoder, loss and link rates are measured on "
                "GPUs); data loading is not modelled either"]
    t, m = plan.time, plan.model
    passes = t.encoder_flops / m.forward_flops()
    recompute = " + recomputed forward" if plan.recipe.model.grad_checkpointing else ""
    step = (f"step time: {seconds_text(t.total)} = encode {seconds_text(t.encode)} (no-grad forward) + loss "
            f"{seconds_text(t.loss)} + re-encode {seconds_text(t.reencode)} (forward + backward{recompute}); "
            "optimizer step not modelled")
    lines = [step,
             f"  encoders: {passes:.0f} passes x {m.forward_flops() / 1e9:.1f} GFLOP x {plan.local_batch:,} samples at "
             f"{t.encoder_rate / 1e12:.0f} TFLOP/s per GPU: {t.encoder_source}",
             f"  loss: 8 B^2 D / {plan.gpus} GPUs at {t.rate.flops / 1e12:.0f} TFLOP/s, from the {t.rate.dtype} "
             f"rates measured at D={t.rate.dim}, for blocks of {t.rate.batch:,}"]
    if plan.decoding is None:  # decoded host batches: the data workers decode, at a rate not modelled
        per_gpu = plan.local_batch / t.total
        lines.append(f"inputs: {per_gpu:,.0f} samples/s per GPU ({per_gpu * min(plan.gpus, plan.gpus_per_node):,.0f} "
                     f"per node) to keep up; data loading is not modelled")
    if t.hop is not None:
        hop = t.hop
        state = "hidden" if hop.hidden else f"exposed: +{seconds_text(plan.gpus * (hop.time - hop.compute))}"
        lines.append(f"ring hop: compute {seconds_text(hop.compute)} (forward {seconds_text(hop.compute_fwd)}, "
                     f"backward {seconds_text(hop.compute_bwd)}) vs transfer {seconds_text(hop.comm)} over "
                     f"{hop.link}: {state}")
        if not hop.hidden:
            most = plan.recipe.batch.global_size // t.hiding_block
            reach = f": at most {most} GPUs for this batch" if most >= 2 else ""
            lines.append(f"  transfers hide behind compute from {t.hiding_block:,} samples per GPU{reach}, or "
                         f"with a faster link than {hop.link}; more GPUs still cut the encoders' time")
    return lines


def _growth_text(growth: float) -> str:
    # Below zero, what does not grow with the batch (one chunk's activations, the model's
    # states) is over the capacity alone: no batch size fits.
    return f"x{growth:.2f}" if growth >= 0 else "over at any batch"


def _limit_lines(plan: Plan) -> List[str]:
    lines = [f"limits (how many times the global batch could grow on {plan.ranks_text()}):"]
    for limit in plan.limits:
        if limit.name in (GPU_LIMIT, HOST_LIMIT):
            used = f"{mem.gib(limit.used)} of {mem.gib(limit.capacity)} GiB"
        else:
            used = f"{seconds_text(limit.used)} of {seconds_text(limit.capacity)}"
        lines.append(f"  {limit.name:<22}{used:>24}   {_growth_text(limit.growth)}")
    binding = plan.limit(plan.binding)
    if plan.on_cpu:
        return lines + [f"binding limit: {binding.name} ({_growth_text(binding.growth)})"]
    share = plan.time.encoders / plan.time.total
    waits = (f", {seconds_text(plan.decoding.wait_s)} of it waiting for decoded rows"
             if plan.decoding is not None and plan.decoding.binds else "")
    lines.append(f"binding limit: {binding.name} ({_growth_text(binding.growth)}); step time "
                 f"{seconds_text(plan.step_seconds)}, {share:.0%} of its compute in the encoders{waits}")
    return lines


def render_plan(plan: Plan, gpu_memory_note: str = "", host_memory_note: str = "", cores_note: str = "",
                notes: Sequence[str] = ()) -> str:
    """The full report; the verdict comes second to last and `peak per GPU: X GiB` (CPU ranks:
    `peak per rank: X GiB, in host memory`) last. Where the GPU and host sizes and the node's
    cores came from (read off this node, or assumed) is said beside them when the caller gives a
    note: in the verdict for the GPUs, on the host line for the host, on the data.decode_workers
    line for the cores. ``notes`` (what this node lacks) come just before the verdict."""
    lines = [_header(plan), ""] + _gpu_table(plan) + ["", _host_line(plan, host_memory_note, cores_note), ""]
    lines += _time_lines(plan)
    lines += [""] + _limit_lines(plan) + [f"advice: {line}" for line in plan.advice] + [f"note: {n}" for n in notes]
    peak = (f"peak per rank: {mem.gib(plan.gpu.allocated_peak)} GiB, in host memory" if plan.on_cpu else
            f"peak per GPU: {mem.gib(plan.peak_gpu_bytes)} GiB")
    lines += [plan.verdict + (f" ({gpu_memory_note})" if gpu_memory_note else ""), peak]
    return "\n".join(lines)


def render_scaling(rows: Sequence[ScalingRow], rates: KernelRates, dim: int, elem: int = 2) -> str:
    """A markdown table of the ring's loss time against ranks, and where transfers stop hiding."""
    networks = list(NETWORKS)
    header = (f"| global B | ranks | local b | kernel rate | compute / hop | transfer / hop "
              f"(NVLink or {' / '.join(networks)}) | loss time ({' / '.join(networks)}) |")
    lines = [header, "|---|---|---|---|---|---|---|"]
    for row in rows:
        hops = list(row.hops.values())
        transfer = " / ".join(f"{hop.comm * 1e3:.2f} ms{'' if hop.hidden else ' (exposed)'}" for hop in hops)
        loss = " / ".join(f"{row.loss_time(name):.2f} s" for name in row.hops)
        if "NVLink" in row.hops:
            transfer, loss = f"{transfer} (NVLink)", f"{loss} (NVLink)"
        lines.append(f"| {count(row.global_batch)} | {row.ranks} | {row.local:,} | {row.rate.flops / 1e12:.0f} TFLOP/s "
                     f"| {hops[0].compute * 1e3:.1f} ms | {transfer} | {loss} |")
    batches = sorted({row.global_batch for row in rows})
    lines += ["", f"Kernel rates: {rates.source}, interpolated in log B between measured sizes (flat below the "
              f"smallest); forward {rates.forward_fraction:.0%} of the kernel time. Links one way: NVLink "
              f"{NVLINK / 1e9:.0f} GB/s, " + ", ".join(f"{n} = {bw / 1e9:.0f} GB/s" for n, bw in NETWORKS.items())
              + ". A hop sends the text block (and, backward, an fp32 partial gradient): 8 D bytes per sample "
              "in bf16 over both passes.", ""]
    block = _crossover(rates, dim, elem, NVLINK)
    lines.append(f"- NVLink (one node): transfers hide behind compute from b = {block:,} samples per GPU.")
    for name, bandwidth in NETWORKS.items():
        block = _crossover(rates, dim, elem, bandwidth)
        reach = "; ".join(f"B={count(b)}: up to {b // block:,} ranks, then the loss time floors at "
                          f"{(2 * elem + 4) * b * dim / bandwidth:.1f} s" for b in batches)
        lines.append(f"- {name}: transfers hide from b = {block:,} samples per GPU ({reach}).")
    return "\n".join(lines)


def _crossover(rates: KernelRates, dim: int, elem: int, bandwidth: float) -> int:
    """min_hidden_block at the rate of blocks that size (two fixed-point steps)."""
    block = 16384
    for _ in range(2):
        rate = rates.rate(block, dim, "bf16" if elem == 2 else "fp32")
        block = min_hidden_block(dim, elem, rate.flops, rates.forward_fraction, bandwidth)
    return block
