"""`infcl-ds bench train` on CPU (2 gloo ranks, the tiny model): this engine's rows and OpenCLIP's
own trainer's (`--impl open_clip_train`) in one JSON with the fields docs/benchmarks/vs_open_clip.json
needs, a later run replacing only its own configuration's rows, the comparison plot, and nothing
written to the working directory (open_clip_train's logs go to a temporary directory)."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIELDS = {"impl", "model", "B", "world", "compile", "zero", "samples_per_s", "step_s", "first_step_s", "device",
          "command", "status"}


def _bench(cwd, out, *args):
    env = dict(os.environ, DS_ACCELERATOR="cpu", MASTER_ADDR="127.0.0.1", OMP_NUM_THREADS="1",
               PYTHONPATH=str(ROOT))
    argv = [sys.executable, "-m", "infcl_ds.cli", "bench", "train", "--model", "infcl-tiny", "--batch", "128",
            "--chunk", "auto", "--world", "2", "--steps", "1", "--open-clip-train-batch-size", "32",
            "--open-clip-train-modes", "eager", "--append", "--out", str(out), *args]
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads(out.read_text())["rows"]


def test_engine_and_open_clip_train_rows_side_by_side(tmp_path):
    work, out = tmp_path / "cwd", tmp_path / "out" / "vs.json"
    work.mkdir()
    rows = _bench(work, out, "--impl", "open_clip_train,infcl_ds")
    assert [(r["impl"], r["status"]) for r in rows] == [("open_clip_train", "measured"), ("infcl_ds", "measured")]
    for row in rows:
        assert FIELDS <= set(row), FIELDS - set(row)
        assert row["model"] == "infcl-tiny" and row["B"] == 128 and row["world"] == 2 and row["compile"] is False
        assert row["samples_per_s"] > 0 and row["first_step_s"] > 0
    ours, theirs = rows[1], rows[0]
    # --chunk auto on CPU ranks: 64 samples, the whole local batch here.
    assert ours["chunk"] == 64 and ours["zero"] == 2 and ours["samples_per_s"] == 128 / ours["step_s"]
    assert "--accum-freq 2" in theirs["command"] and "--local-loss --gather-with-grad" in theirs["command"]
    assert list(work.iterdir()) == []  # open_clip_train wrote its logs elsewhere
    assert out.with_suffix(".png").stat().st_size > 10_000

    # A ZeRO-0 run of this engine adds its row; the ZeRO-2 row and open_clip_train's stay.
    rows = _bench(work, out, "--impl", "infcl_ds", "--zero", "0")
    assert sorted((r["impl"], r["zero"]) for r in rows) == [("infcl_ds", 0), ("infcl_ds", 2), ("open_clip_train", None)]
    # The same configuration again replaces its row.
    rows = _bench(work, out, "--impl", "infcl_ds", "--zero", "0")
    assert len(rows) == 3
