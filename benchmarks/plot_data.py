"""Plots of the input-pipeline benchmarks: decode throughput and host memory."""
import json
from pathlib import Path

from .plot import pyplot, save


def plot_data(json_path: Path, png_path: Path) -> None:
    """Decoded samples/s against decode processes, with each recipe's need per rank."""
    plt = pyplot()
    data = json.loads(Path(json_path).read_text())
    rows = data["rows"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for impl, marker in (("pil", "-o"), ("torchvision", "-^"), ("nvjpeg", "-s")):
        pts = sorted((r for r in rows if r["what"] == "decode" and r["impl"] == impl), key=lambda r: r["workers"])
        if pts:
            ax.plot([r["workers"] for r in pts], [r["samples_per_s"] for r in pts], marker,
                    label=f"{impl}: decode + open_clip train transform")
    for r in (r for r in rows if r["what"] == "train" and r["step"] > 1):
        ax.plot([r["decode_workers"]], [r["decodes_per_s"]], "*", ms=12,
                label=f"{r.get('impl', 'pil')}: during a {r['model']} training step (B={r['B']:,})")
    for r in (r for r in rows if r["what"] == "needed"):
        ax.axhline(r["decodes_per_s_per_rank"], ls=":", lw=1, color="gray")
        ax.annotate(f"{r['recipe']} needs", (0, r["decodes_per_s_per_rank"]), fontsize=7, va="bottom")
    ax.set_xlabel("decode processes per rank")
    ax.set_ylabel("samples / s")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    meta = data["meta"]
    ax.set_title(f"decode throughput, {meta.get('device', '')} host ({meta.get('cpus', '?')} CPUs), "
                 f"commit {meta.get('commit', '')}", fontsize=9)
    save(fig, png_path)


def plot_host_memory(json_path: Path, png_path: Path) -> None:
    """Host memory and step time of a real run per host form, measured beside planned."""
    plt = pyplot()
    data = json.loads(Path(json_path).read_text())
    rows = data["rows"]
    timelines = [r for r in rows if r.get("host_timeline")]
    fig, axes = plt.subplots(1, 3 if timelines else 2, figsize=(18 if timelines else 12, 4.5))
    labels = [f"{r['host_batch']}{' ' + r['decoder'] if r.get('decoder') else ''}\n{r['model']}\nB={r['B']:,}"
              + ("\n(partial: no steady step)" if str(r.get("status", "")).startswith("partial") else "")
              for r in rows]
    x = range(len(rows))
    axes[0].bar([i - 0.27 for i in x], [r.get("peak_rss_gib") or 0 for r in rows], 0.27,
                label="measured: machine in use above the start")
    axes[0].bar(list(x), [r.get("peak_tree_pss_gib") or 0 for r in rows], 0.27, label="measured: trainer tree's PSS")
    axes[0].bar([i + 0.27 for i in x], [r.get("plan_host_gib") or 0 for r in rows], 0.27, label="planned")
    axes[0].axhline(rows[0]["host_gib"], color="red", ls=":", label="host memory")
    axes[0].set_ylabel("GiB")
    axes[0].set_title("host memory")
    axes[1].bar([i - 0.2 for i in x], [r.get("step_s") or 0 for r in rows], 0.4, label="measured step")
    axes[1].bar([i + 0.2 for i in x], [r.get("plan_step_s") or 0 for r in rows], 0.4, label="planned step")
    axes[1].set_ylabel("s")
    axes[1].set_title("step time")
    for ax in axes[:2]:
        ax.set_xticks(list(x), labels, fontsize=8)
        ax.legend(fontsize=8)
    if timelines:  # when each run's host memory peaked (host_memory.py's MemorySampler)
        for r in timelines:
            t, used, shared = zip(*((p[0], p[1], p[3]) for p in r["host_timeline"]))
            line, = axes[2].plot(t, used, label=f"{r['host_batch']} {r.get('decoder') or ''} B={r['B']:,} "
                                 f"({r.get('commit', '')}): in use above the start")
            axes[2].plot(t, shared, ls=":", color=line.get_color(), label="the machine's shared memory")
            if len(r["host_timeline"][0]) > 5:  # timelines from before the PSS column have 5
                axes[2].plot(t, [p[5] for p in r["host_timeline"]], ls="--", color=line.get_color(),
                             label="the trainer tree's PSS")
        axes[2].set_xlabel("s since the trainer started")
        axes[2].set_ylabel("GiB in use above the start")
        axes[2].set_title("host memory over the run")
        axes[2].legend(fontsize=8)
    meta = data["meta"]
    commits = ", ".join(dict.fromkeys(r["commit"] for r in rows if r.get("commit")))  # each row's own
    fig.suptitle(f"host batches on {meta.get('device', '')}, commits {commits}", fontsize=10)
    save(fig, png_path)


def plot_decode(json_path: Path, png_path: Path) -> None:
    """The GPU decoder's rows (benchmarks/decode.py): images/s and host µs per image of each
    library and backend, alone and beside training, per shard folder; the towers' slowdown beside;
    the step rows' JPEG rate over the synthetic rate of the same run."""
    plt = pyplot()
    data = json.loads(Path(json_path).read_text())
    rows = [r for r in data["rows"] if r.get("kind") != "step" and {"images_per_s", "shards"} <= set(r)]
    steps = [r for r in data["rows"] if r.get("kind") == "step" and r.get("vs_synthetic") is not None]
    keys = list(dict.fromkeys((r["shards"], r["gpu_jpeg_library"], r["backend"]) for r in rows))
    fig, axes = plt.subplots(1, 4, figsize=(19, 4.5))
    x = range(len(keys))
    for offset, beside, label in ((-0.2, False, "alone"), (0.2, True, "beside training")):
        by_key = {(r["shards"], r["gpu_jpeg_library"], r["backend"]): r for r in rows if r["beside_training"] == beside}
        for ax, field in ((axes[0], "images_per_s"), (axes[1], "host_us_per_image")):
            ax.bar([i + offset for i in x], [(by_key.get(k) or {}).get(field) or 0 for k in keys], 0.4, label=label)
    beside_rows = {(r["shards"], r["gpu_jpeg_library"], r["backend"]): r for r in rows if r["beside_training"]}
    axes[2].bar(list(x), [(beside_rows.get(k) or {}).get("towers_slowdown") or 0 for k in keys], 0.6)
    axes[2].axhline(1.0, color="gray", ls=":")
    def lanes(r):
        return f", {r['gpu_decode_lanes']} lanes" if (r.get("gpu_decode_lanes") or 1) > 1 else ""
    labels = [f"{r['model']} {r['B'] // 1024}k x{r['world']}, {r['cores']} cores\n"
              f"{r.get('gpu_jpeg_library')}{lanes(r)}: {r['decoder_resolved']} ({r['commit'][:7]})" for r in steps]
    axes[3].bar(range(len(steps)), [r["vs_synthetic"] for r in steps], 0.6)
    axes[3].axhline(0.98, color="red", ls=":", lw=1, label="0.98")
    axes[3].set_ylim(0.5, 1.05)
    axes[3].set_xticks(list(range(len(steps))))
    axes[3].set_xticklabels(labels, rotation=30, ha="right", fontsize=7)
    axes[3].set_title("steps from JPEG / synthetic steps, same run", fontsize=9)
    axes[3].legend(fontsize=8)
    titles = ("images decoded and cropped / s", "host µs per image", "towers' time beside the decoder / alone")
    for ax, title in zip(axes, titles):
        ax.set_xticks(list(x))
        ax.set_xticklabels([" ".join(k) for k in keys], rotation=30, ha="right", fontsize=7)
        ax.set_title(title, fontsize=9)
    axes[0].axhline(10_000, color="red", ls=":", lw=1, label="10,000 / s")
    axes[1].axhline(50, color="red", ls=":", lw=1, label="50 µs")
    axes[0].legend(fontsize=8)
    axes[1].legend(fontsize=8)
    meta = data["meta"]
    fig.suptitle(f"the GPU decoder, {meta.get('device', '')}, commit {meta.get('commit', '')}", fontsize=10)
    save(fig, png_path)


def plot_decode_variants(json_path: Path, png_path: Path) -> None:
    """What sets the GPU decoder's pace beside training (decode_variants.json): per variant, the
    images/s beside training, host µs per image and the towers' slowdown of each library as the
    trainer runs it (nvImageCodec with the trainer's backends, torchvision) on each shard folder, the
    variants of one command beside their baseline (`none`, or one decoding thread)."""
    plt = pyplot()
    data = json.loads(Path(json_path).read_text())
    # the two decoders the trainer can be given (decode.png has every backend)
    rows = [r for r in data["rows"] if r.get("beside_training") and r.get("images_per_s")
            and r.get("backend") in ("trainer's", "nvjpeg")]
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    series = list(dict.fromkeys((r["shards"], r["gpu_jpeg_library"], r["backend"]) for r in rows))
    fig, axes = plt.subplots(1, 3, figsize=(18, 4.8))
    width = 0.8 / max(len(series), 1)
    for k, key in enumerate(series):
        by_variant = {r["variant"]: r for r in rows if (r["shards"], r["gpu_jpeg_library"], r["backend"]) == key}
        at = [i + (k - (len(series) - 1) / 2) * width for i in range(len(variants))]
        for ax, field in zip(axes, ("images_per_s", "host_us_per_image", "towers_slowdown")):
            ax.bar(at, [(by_variant.get(v) or {}).get(field) or 0 for v in variants], width, label=" ".join(key))
    for ax, title in zip(axes, ("images decoded and cropped / s beside training", "host µs per image",
                                "towers' time beside the decoder / alone")):
        ax.set_xticks(list(range(len(variants))))
        ax.set_xticklabels(variants, rotation=30, ha="right", fontsize=8)
        ax.set_title(title, fontsize=9)
    axes[0].axhline(10_000, color="red", ls=":", lw=1)
    axes[1].axhline(50, color="red", ls=":", lw=1)
    axes[2].axhline(1.0, color="gray", ls=":")
    axes[0].legend(fontsize=7)
    meta = data["meta"]
    fig.suptitle(f"the GPU decoder beside training, by variant, {meta.get('device', '')}", fontsize=10)
    save(fig, png_path)
