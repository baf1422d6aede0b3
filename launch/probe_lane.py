"""Where the GPU decoder's lane spends its host time (data/decoding/device_decode.py
BatchedDevicePieces), per 1,024-row piece of the photos shards, stage by stage: the blobs made
tensors, nvJPEG's batched decode, the crop draws (all rows at once; beside them the former
row-by-row draws), the crop-and-resize (one kernel; beside it the former torch-op version); alone,
then while another thread keeps the GPU's launch queue full from Python as the training loop does
(the lane shares the interpreter lock with it). One GPU:

    PYTHONPATH=$PWD python3 launch/probe_lane.py OUT.json [SHARD_DIR]

Not a benchmark of record: it finds what to change in the lane.
"""
import json
import sys
import threading
import time
from pathlib import Path

import torch

from benchmarks.decode import PIECE, blobs_from
from infcl_ds.data.decoding.device_decode import CropGeometry, decode_jpegs, resized_crops, resized_crops_torch
from infcl_ds.data.decoding.transforms import sample_seed, uint8_image_transform


def stages(blobs, geometry, device):
    """Seconds of each stage for one piece, the GPU synchronised after each."""
    t = [time.perf_counter()]
    images = decode_jpegs(blobs, device)
    torch.cuda.synchronize()
    t.append(time.perf_counter())
    boxes = geometry.boxes(images, [sample_seed(0, 0, i) for i in range(len(images))])
    t.append(time.perf_counter())
    resized_crops(images, boxes, geometry.size[0])
    torch.cuda.synchronize()
    t.append(time.perf_counter())
    # the former crop-and-resize in torch ops (~7 launches a row), for comparison; not in piece_s
    resized_crops_torch(images, boxes, geometry.size[0])
    torch.cuda.synchronize()
    t.append(time.perf_counter())
    # and the crops drawn row by row through torch's generator, as before crop_draws.py
    [geometry.box(im, sample_seed(0, 0, i)) for i, im in enumerate(images)]
    t.append(time.perf_counter())
    return {"decode_s": t[1] - t[0], "boxes_s": t[2] - t[1], "resize_s": t[3] - t[2], "piece_s": t[3] - t[0],
            "resize_torch_ops_s": t[4] - t[3], "boxes_row_by_row_s": t[5] - t[4]}


class BusyLaunches(threading.Thread):
    """A thread launching small bf16 products back to back from Python, as the towers' chunk
    passes do: the GPU queue stays full and the interpreter lock is mostly held."""

    def __init__(self):
        super().__init__(daemon=True)
        self.stop, self.launches = False, 0

    def run(self):
        x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16) / 64
        while not self.stop:
            for _ in range(32):
                y = torch.nn.functional.gelu(x @ w)
                x = torch.nn.functional.layer_norm(y, y.shape[-1:])
            self.launches += 96


def mean_of(rows):
    return {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}


def main():
    out = Path(sys.argv[1])
    shard_dir = Path(sys.argv[2] if len(sys.argv) > 2 else "/tmp/infcl-ds-photos")
    blobs = blobs_from(shard_dir, 4 * PIECE)
    geometry = CropGeometry(uint8_image_transform(224, augment=True))
    device = torch.device("cuda")
    pieces = [blobs[i:i + PIECE] for i in range(0, len(blobs), PIECE)]
    for piece in pieces:  # warm: the decoder's handles, every buffer shape
        stages(piece, geometry, device)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "piece_rows": PIECE,
              "bytes_per_jpeg": sum(map(len, blobs)) / len(blobs)}
    alone = mean_of([stages(p, geometry, device) for p in pieces])
    result["alone"] = {**alone, "rows_per_s": PIECE / alone["piece_s"]}
    print("alone", json.dumps(result["alone"]), flush=True)

    busy = BusyLaunches()
    busy.start()
    time.sleep(1.0)
    n0, t0 = busy.launches, time.perf_counter()
    contended = mean_of([stages(p, geometry, device) for p in pieces])
    launches_per_s = (busy.launches - n0) / (time.perf_counter() - t0)
    busy.stop = True
    busy.join()
    n0, t0 = 0, time.perf_counter()
    solo = BusyLaunches()
    solo.start()
    time.sleep(2.0)
    solo.stop = True
    solo.join()
    result["beside_launching_thread"] = {**contended, "rows_per_s": PIECE / contended["piece_s"],
                                         "other_thread_launches_per_s": launches_per_s,
                                         "other_thread_alone_launches_per_s": solo.launches / (time.perf_counter() - t0)}
    print("beside a launching thread", json.dumps(result["beside_launching_thread"]), flush=True)

    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        stages(pieces[0], geometry, device)
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
    print(table, flush=True)
    result["profile_top_self_cpu"] = table
    out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
