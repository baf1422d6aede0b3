"""PNG plots of benchmark JSON: time and memory against batch size, log-log."""
import json
import re
from pathlib import Path

from .harness import as_current


def short_commit(commit: str) -> str:
    """A hash as git abbreviates it (rows carry the full one); anything else as written."""
    return commit[:7] if re.fullmatch(r"[0-9a-f]{8,40}", commit) else commit


def pyplot():
    """matplotlib's pyplot, drawing to files only (no display on the GPU machines)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save(fig, png_path: Path) -> None:
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    pyplot().close(fig)


def loss_rows(json_path: Path):
    """(the file's data, its timed rows in this schema's names) of a loss or ring benchmark."""
    data = json.loads(Path(json_path).read_text())
    return data, [as_current(r) for r in data["rows"] if r.get("ms")]


def log_axes(ax, xlabel: str, title: str) -> None:
    """A batch-size axis in powers of two against a logarithmic value axis, gridded."""
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)


def plot_loss(json_path: Path, png_path: Path) -> None:
    plt = pyplot()
    data, rows = loss_rows(json_path)
    dtypes = sorted({r["dtype"] for r in rows})
    fig, axes = plt.subplots(len(dtypes), 2, figsize=(12, 4.5 * len(dtypes)), squeeze=False)
    colors = {"infcl_ds": "tab:blue", "full_logits": "tab:orange", "inf_cl": "tab:red"}
    styles = ["-", "--", ":", "-."]
    for ax_row, dt in zip(axes, dtypes):
        dims = sorted({r["D"] for r in rows if r["dtype"] == dt})
        for impl in colors:
            for k, D in enumerate(dims):
                pts = sorted((r for r in rows if r["impl"] == impl and r["dtype"] == dt and r["D"] == D),
                             key=lambda r: r["B"])
                if not pts:
                    continue
                for ax, key in zip(ax_row, ("ms", "peak_mib")):
                    xs = [r["B"] for r in pts if r.get(key)]
                    ys = [r[key] / (1e3 if key == "ms" else 1024) for r in pts if r.get(key)]
                    if not xs:
                        continue
                    ax.plot(xs, ys, styles[k % 4], color=colors[impl], marker="o", label=f"{impl} D={D}")
                    ext = [r for r in pts if r.get("status") == "extrapolated" and r.get(key)]
                    ax.scatter([r["B"] for r in ext], [r[key] / (1e3 if key == "ms" else 1024) for r in ext],
                               facecolors="none", edgecolors="k", s=90, zorder=3)
        for ax, title in zip(ax_row, ("forward + backward time (s)", "peak memory above inputs (GiB)")):
            if not ax.has_data():
                ax.text(0.5, 0.5, "not measured on this device", ha="center", transform=ax.transAxes)
                continue
            log_axes(ax, "batch B", f"{title}, {dt} inputs")
        ax_row[0].legend(fontsize=7, ncol=2)
    meta = data.get("meta", {})
    fig.suptitle(f"bidirectional CLIP loss on {meta.get('device', '?')} (circled: extrapolated)")
    save(fig, png_path)


def plot_ring(json_path: Path, png_path: Path) -> None:
    """Per-GPU effective rate and time against the global batch, one line per impl and D."""
    plt = pyplot()
    data, rows = loss_rows(json_path)
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    colors = {"infcl_ds": "tab:blue", "infcl_ds_1gpu": "tab:cyan", "inf_cl": "tab:red", "open_clip": "tab:orange"}
    for impl, color in colors.items():
        for k, D in enumerate(sorted({r["D"] for r in rows})):
            pts = sorted((r for r in rows if r["impl"] == impl and r["D"] == D), key=lambda r: r.get("same_work_as_B", r["B"]))
            if not pts:
                continue
            xs = [r.get("same_work_as_B", r["B"]) for r in pts]
            style = "-" if k == 0 else "--"
            axes[0].plot(xs, [r["ms"] / 1e3 for r in pts], style, color=color, marker="o", label=f"{impl} D={D}")
            axes[1].plot(xs, [r["tflops_eff"] for r in pts], style, color=color, marker="o", label=f"{impl} D={D}")
            mem = [(x, r["peak_mib"] / 1024) for x, r in zip(xs, pts) if r.get("peak_mib")]
            if mem:
                axes[2].plot(*zip(*mem), style, color=color, marker="o", label=f"{impl} D={D}")
            ext = [(x, r) for x, r in zip(xs, pts) if r.get("status") == "extrapolated"]
            axes[0].scatter([x for x, _ in ext], [r["ms"] / 1e3 for _, r in ext], facecolors="none", edgecolors="k", s=90, zorder=3)
    titles = ("forward + backward time (s)", "effective TFLOP/s per GPU", "peak memory per GPU above inputs (GiB)")
    for ax, title in zip(axes, titles):
        if not ax.has_data():
            continue
        log_axes(ax, "global batch B (1-GPU rows: same per-GPU work)", title)
    axes[0].legend(fontsize=7)
    meta = data.get("meta", {})
    fig.suptitle(f"ring over {meta.get('world', '?')} x {meta.get('device', '?')}, bf16 (circled: extrapolated)")
    save(fig, png_path)


def plot_siglip(json_path: Path, png_path: Path) -> None:
    """The sigmoid loss's rate and memory against the batch, one line per impl and D."""
    plt = pyplot()
    data, rows = loss_rows(json_path)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    # This code first (blue), its one-GPU rows, then open_clip's (each dist_impl its own colour).
    impls = sorted({r["impl"] for r in rows}, key=lambda i: (not i.startswith("infcl_ds"), i))
    colors = {impl: f"C{n}" for n, impl in enumerate(impls)}
    for k, D in enumerate(sorted({r["D"] for r in rows})):
        for impl, color in colors.items():
            pts = sorted((r for r in rows if r["impl"] == impl and r["D"] == D), key=lambda r: r["B"])
            if pts:
                style = ["-", "--", ":"][k % 3]
                axes[0].plot([r["B"] for r in pts], [r["tflops_eff"] for r in pts], style, color=color, marker="o",
                             label=f"{impl} D={D}")
                axes[1].plot([r["B"] for r in pts], [(r["peak_mib"] or 0) / 1024 for r in pts], style, color=color,
                             marker="o", label=f"{impl} D={D}")
    for ax, title in zip(axes, ("effective rate 6 B^2 D / time (TFLOP/s)", "peak memory above inputs (GiB)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch B")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        if ax.has_data():
            ax.legend(fontsize=8)
    if any(r.get("peak_mib") for r in rows):
        axes[1].set_yscale("log")
    device = data["meta"].get("device", "")
    fig.suptitle(f"sigmoid (SigLIP) loss, forward + backward, {rows[0]['dtype'] if rows else ''} on {device}")
    save(fig, png_path)


def plot_train(json_path: Path, png_path: Path) -> None:
    """Engine steps: samples/s and per-phase time against the global batch, per impl; peak
    memory per GPU against the local batch (the slope is the per-sample cost)."""
    plt = pyplot()
    data = json.loads(Path(json_path).read_text())
    rows = [r for r in data["rows"] if r.get("status") == "measured"]
    colors = {"infcl_ds": "tab:blue", "open_clip": "tab:orange", "inf_cl": "tab:red"}
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    for impl, color in colors.items():
        pts = sorted((r for r in rows if r["impl"] == impl), key=lambda r: r["B"])
        if not pts:
            continue
        axes[0].plot([r["B"] for r in pts], [r["samples_per_s"] for r in pts], "-o", color=color, label=impl)
        axes[1].plot([r["B"] for r in pts], [r["loss_share"] for r in pts], "-o", color=color, label=impl)
        mem = [r for r in pts if r.get("peak_mib_max")]
        axes[2].plot([r["local"] for r in mem], [r["peak_mib_max"] / 1024 for r in mem], "-o", color=color,
                     label=f"{impl}: step")
        axes[2].plot([r["local"] for r in mem], [r["peak_mib"]["loss"] / 1024 for r in mem], ":s", color=color,
                     label=f"{impl}: loss phase")
        # The planner's allocated prediction (what the measured peak reads); older runs only
        # have its total, which adds the runtime reserve.
        key = "plan_allocated_mib" if any(r.get("plan_allocated_mib") for r in mem) else "plan_peak_mib"
        plan = [r for r in mem if r.get(key)]
        if plan:
            axes[2].plot([r["local"] for r in plan], [r[key] / 1024 for r in plan], "x--", color=color,
                         label=f"{impl}: planner")
    titles = ("samples / s (whole step)", "loss (+ ring) share of the step", "peak memory per GPU (GiB)")
    xlabels = ("global batch", "global batch", "local batch")
    for ax, title, xlabel in zip(axes, titles, xlabels):
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.set_xscale("log", base=2)
        if ax.has_data():
            ax.legend(fontsize=8)
    meta = data["meta"]
    fig.suptitle(f"{meta.get('model', '')} engine steps, {meta.get('world', '?')} x {meta.get('device', '')}, "
                 f"chunk {meta.get('chunk', '?')}, ZeRO-{meta.get('zero', '?')}, commit {meta.get('commit', '')}")
    save(fig, png_path)


def plot_train_configurations(json_path: Path, png_path: Path) -> None:
    """Trainers side by side (docs/benchmarks/vs_open_clip.json): steady samples/s of each
    configuration (impl, compiled or eager, ZeRO stage) per model and global batch; a
    configuration that did not run at a batch shows its status instead of a bar."""
    plt = pyplot()
    data = json.loads(Path(json_path).read_text())
    rows = data["rows"]
    groups = sorted({(r["model"], r["B"]) for r in rows}, key=lambda g: (g[0], g[1]))

    def label(r):
        zero = f", ZeRO-{r['zero']}" if r.get("zero") is not None else ""
        # a --set key by its last name ("float8" for model.float8=true), with its value unless true
        extra = "".join(f", {key.split('.')[-1]}" + ("" if value.lower() == "true" else f"={value}")
                        for key, _, value in (item.partition("=") for item in r.get("set", ())))
        # synthetic data is the default row of this file; only another source is named
        data = (f", {r['data']}" + (f" ({r['decoder']})" if r.get("decoder") else "")
                if r.get("data") not in (None, "synthetic") else "")
        return f"{r['impl']} {'compiled' if r.get('compile') else 'eager'}{zero}{extra}{data}"
    configs = sorted({label(r) for r in rows})
    colors = plt.get_cmap("tab10")
    width = 0.8 / max(1, len(configs))
    fig, ax = plt.subplots(figsize=(max(8, 2.2 * len(groups) + 3), 5))
    for c, config in enumerate(configs):
        for g, group in enumerate(groups):
            row = next((r for r in rows if label(r) == config and (r["model"], r["B"]) == group), None)
            if row is None:
                continue
            x = g + (c - (len(configs) - 1) / 2) * width
            if row.get("status") == "measured":
                ax.bar(x, row["samples_per_s"], width, color=colors(c), label=config)
                ax.text(x, row["samples_per_s"], f"{row['samples_per_s']:,.0f}", ha="center", va="bottom", fontsize=7)
            else:
                ax.text(x, 0, row.get("status", "?"), rotation=90, ha="center", va="bottom", fontsize=7, color=colors(c))
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), unique.keys(), fontsize=8)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([f"{m}\nB={b:,}" for m, b in groups])
    ax.set_ylabel("samples / s (steady steps)")
    meta = data["meta"]
    commits = ", ".join(dict.fromkeys(short_commit(r["commit"]) for r in rows if r.get("commit"))) or meta.get("commit", "")
    ax.set_title(f"Trainers on {meta.get('device', '')}, commits {commits}")  # rows keep their own
    save(fig, png_path)


def plot_scale(json_path: Path, png_path: Path) -> None:
    """Scaling runs (docs/benchmarks/scale.json), each part with its card: samples/s per GPU beside
    the planner's (efficiency over the bar); the step measured beside the planner's, its decode
    wait marked; measured against planned host and GPU memory; the losses of the one-node and
    two-node runs. This engine's rows only (OpenCLIP's trainer beside it has no plan)."""
    plt = pyplot()
    data = json.loads(Path(json_path).read_text())
    rows = [r for r in data["rows"] if "samples_per_s" in r and r.get("impl", "infcl_ds") == "infcl_ds"]
    fig, axes = plt.subplots(1, 4, figsize=(22, 4.8))
    names = [f"{r['part']}\n{r['world']} x {str(r.get('device', '')).replace('NVIDIA ', '')}, {r['nodes']} node"
             f"{'s' if r['nodes'] > 1 else ''}" for r in rows]
    xs = range(len(rows))
    ax = axes[0]
    ax.bar([x - 0.2 for x in xs], [r["samples_per_s"] / r["world"] for r in rows], 0.4, label="measured")
    ax.bar([x + 0.2 for x in xs], [r["B"] / r["world"] / r["plan_step_s"] for r in rows], 0.4, label="planner")
    for x, r in zip(xs, rows):
        if r.get("efficiency"):
            ax.text(x - 0.2, r["samples_per_s"] / r["world"], f"{r['efficiency']:.2f}", ha="center", va="bottom",
                    fontsize=8)
    ax.set_title("samples / s per GPU (efficiency against its reference over the bar)")
    ax = axes[1]
    ax.bar([x - 0.2 for x in xs], [r["step_s"] for r in rows], 0.4, label="measured step")
    ax.bar([x - 0.2 for x in xs], [r.get("decode_wait_s", 0.0) for r in rows], 0.4, label="of it waiting on decoding",
           color="tab:red")
    ax.bar([x + 0.2 for x in xs], [r["plan_step_s"] for r in rows], 0.4, label="planner's step")
    ax.set_yscale("log")
    ax.set_title("step (s), log scale")
    for i, (key, plan, scale, title) in enumerate((("host_gib", "plan_host_gib", 1, "host memory (GiB)"),
                                                    ("peak_mib", "plan_peak_mib", 1 / 1024,
                                                     "peak allocated per GPU (GiB)"))):
        offset = 0.2 * (2 * i - 1)
        def values(k):  # a row without the figure (not sampled) leaves its bar out
            return [r[k] * scale if r.get(k) is not None else float("nan") for r in rows]
        axes[2].bar([x + offset - 0.1 for x in xs], values(key), 0.2, label=f"{title}: measured")
        axes[2].bar([x + offset + 0.1 for x in xs], values(plan), 0.2, label=f"{title}: planner", alpha=0.6)
    axes[2].set_title("memory: measured beside the planner's")
    for ax in axes[:3]:
        ax.set_xticks(list(xs))
        ax.set_xticklabels(names, fontsize=6, rotation=30, ha="right")
        ax.legend(fontsize=7)
    for r in rows:
        if r["part"] in ("one-node-64k", "two-nodes-64k"):
            axes[3].plot(r["steps"], r["loss"], "-o" if r["nodes"] == 1 else "--x", label=f"{r['part']}")
    axes[3].set_title("loss per step, one node and two nodes")
    axes[3].set_xlabel("step")
    axes[3].xaxis.get_major_locator().set_params(integer=True)
    if axes[3].has_data():
        axes[3].legend(fontsize=8)
    commits = ", ".join(dict.fromkeys(short_commit(r["commit"]) for r in rows if r.get("commit")))
    models = " and ".join(dict.fromkeys(r["model"] for r in rows if r.get("model")))
    fig.suptitle(f"{models} from JPEG shards through launch/train.sh; commits {commits}")
    save(fig, png_path)


def plot_split_moves(json_path: Path, part: str, png_path: Path) -> None:
    """One run's steps with `hybrid` (a row of docs/benchmarks/scale.json, rank 0's metrics.csv
    columns): the step and its wait for decoded rows, and each decoder's rate beside the GPU's
    share of the step's chunks."""
    plt = pyplot()
    data = json.loads(Path(json_path).read_text())
    row = next(r for r in data["rows"] if r["part"] == part)
    steps = row["steps"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.bar(steps, row["steps_s"], color="tab:blue", label="step")
    left.bar(steps, row["decode_waits_s"], color="tab:red", label="of it waiting for decoded rows")
    if len(row.get("decode_waits_gpu_s") or ()) == len(steps):
        left.bar(steps, row["decode_waits_gpu_s"], color="tab:purple", label="of it for the GPU decoder's rows")
    left.set_xlabel("step")
    left.set_ylabel("seconds")
    left.set_xticks(steps)
    left.legend(fontsize=8)
    workers = next((int(m) for m in re.findall(r"data\.decode_workers=(\d+)", " ".join(row.get("planner_said", ())))),
                   None)
    right.plot(steps, row["decode_gpu_rows_per_s"], "o-", label="GPU decoder, rows/s of busy time")
    per_process = row.get("decode_rows_per_process_steps") or []
    if workers and len(per_process) == len(steps):
        right.plot(steps, [workers * r for r in per_process], "s-",
                   label=f"{workers} decode processes, rows/s of busy time")
    right.set_xlabel("step")
    right.set_ylabel("rows / s")
    right.set_xticks(steps)
    share = right.twinx()
    share.plot(steps, row["decode_gpu_shares"], "k--", label="GPU's share of each chunk")
    share.set_ylim(0, 1)
    share.set_ylabel("data.gpu_decode_share")
    lines = right.get_legend_handles_labels()
    more = share.get_legend_handles_labels()
    right.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, loc="lower left")
    fig.suptitle(f"{part}: {row.get('model')} at {row.get('B'):,} on {row.get('world')} x {row.get('device', '')}, "
                 f"hybrid's split, rank 0; commit {short_commit(row.get('commit', ''))}")
    save(fig, png_path)
