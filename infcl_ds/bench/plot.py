"""PNG plots of benchmark JSON: time and memory against batch size, log-log."""
import json
from pathlib import Path


def plot_loss(json_path: Path, png_path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(Path(json_path).read_text())
    rows = [r for r in data["rows"] if r.get("ms")]
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
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("batch B")
            ax.set_title(f"{title}, {dt} inputs")
            ax.grid(True, which="both", alpha=0.3)
        ax_row[0].legend(fontsize=7, ncol=2)
    meta = data.get("meta", {})
    fig.suptitle(f"bidirectional CLIP loss on {meta.get('device', '?')} (circled: extrapolated)")
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    plt.close(fig)
