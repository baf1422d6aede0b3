"""PNG of `launch/probe_towers.py` rows gathered into a record (docs/benchmarks/towers_float8.json):
seconds per sample of the towers' no-grad and grad chunk passes, per variant, stacked.

    python -m benchmarks.plot_towers docs/benchmarks/towers_float8.json
"""
import json
import sys
from pathlib import Path

from .plot import pyplot, save


def plot_towers(json_path: Path, png_path: Path) -> None:
    data = json.loads(Path(json_path).read_text())
    rows = data["rows"]
    plt = pyplot()
    several = len({(r["model"], r["chunk"]) for r in rows}) > 1  # then each label names its model and chunk
    fig, ax = plt.subplots(figsize=(12 if several else 10, 0.6 * len(rows) + 1.8))
    labels = [(f"{r['model']}:{r['chunk']} " if several else "") + f"{r['variant']} ({r.get('run', data['meta'].get('commit', '?'))})"
              for r in rows]
    nograd = [r["nograd_chunk_s"] / r["chunk"] * 1e3 for r in rows]
    grad = [r["grad_chunk_s"] / r["chunk"] * 1e3 for r in rows]
    ax.barh(labels, nograd, color="tab:blue", label="no-grad pass (encode)")
    ax.barh(labels, grad, left=nograd, color="tab:orange", label="forward with grad + backward (re-encode)")
    for y, (a, b, r) in enumerate(zip(nograd, grad, rows)):
        ax.text(a + b, y, f" {a + b:.3f} ms, peak {r['peak_mib'] / 1024:.0f} GiB", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms per sample, the four passes of a GradCache step", fontsize=8)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_xlim(0, 1.45 * max(a + b for a, b in zip(nograd, grad)))
    meta = data["meta"]
    ax.set_title(f"{meta['model']} towers" + ("" if several else f", chunk {rows[0]['chunk']}") + ", bf16 model\n"
                 f"{meta['device']}, torch {meta['torch']}, torchao {meta.get('torchao')}", fontsize=9)
    save(fig, png_path)


if __name__ == "__main__":
    path = Path(sys.argv[1])
    plot_towers(path, path.with_suffix(".png"))
