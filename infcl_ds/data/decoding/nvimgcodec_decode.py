"""The GPU decoder's JPEGs through NVIDIA's nvImageCodec (`data.gpu_jpeg_library: nvimgcodec`,
installed by the `gpu-decode` extra): the same contract as torchvision's decode_jpegs
(device_decode.py), one uint8 [3, h, w] tensor or None per blob, on the device.

A piece is one batched call. On a GPU, nvImageCodec picks per image the first of its backends
that can decode it: the hardware JPEG decoder (A100, H100, H200: off the SMs), then nvJPEG's
CUDA decoder, then its hybrid one. It writes planar RGB (the [3, h, w] layout the crops read),
synchronised with the caller's CUDA stream, and torch takes each image without a copy
(DLPack). On the CPU (the tests) it decodes with libjpeg-turbo, as torchvision and PIL do:
the same pixels. EXIF orientation is ignored, as open_clip's PIL loading ignores it.

Images it cannot parse or decode (not a JPEG, corrupt, truncated) are PIL's, as with
torchvision (by_pil_where_missing). The library's own log lines are off unless
PYNVIMGCODEC_VERBOSITY is set: an undecodable image is counted by the data path, not printed.
"""
import importlib
import os
from typing import List, Optional

import numpy as np
import torch

from ..errors import DataError
from .decode_pieces import JPEG_MAGIC, by_pil_where_missing

EXTRA = "gpu-decode"
# The data.decoder values that decode on the GPU, with data.gpu_jpeg_library's library.
GPU_DECODERS = ("nvjpeg", "hybrid")


def nvimgcodec_module():
    """nvidia.nvimgcodec, or a DataError naming the extra that installs it."""
    os.environ.setdefault("PYNVIMGCODEC_VERBOSITY", "0")  # read when the module loads
    try:
        return importlib.import_module("nvidia.nvimgcodec")
    except ImportError:
        raise DataError(f"data.gpu_jpeg_library=nvimgcodec needs NVIDIA's nvImageCodec, which is not installed: "
                        f"pip install 'infcl_ds[{EXTRA}]' (or data.gpu_jpeg_library=torchvision)") from None


def require_gpu_jpeg_library(data) -> None:
    """DataError naming the extra (nvimgcodec_module) where the recipe's data section decodes its
    JPEGs with nvImageCodec and it is not installed: data.gpu_jpeg_library=nvimgcodec with a
    decoder that decodes on the GPU, or data.decoder=auto, which a GPU rank may resolve to hybrid
    (plan/auto_values.py). The trainer (with the decoder resolved) and `infcl-ds data check`
    both refuse here."""
    if (data.gpu_jpeg_library == "nvimgcodec" and data.host_batch == "encoded"
            and data.decoder in GPU_DECODERS + ("auto",)):
        nvimgcodec_module()


# nvImageCodec's GPU backends in the order the decoder tries them: the hardware JPEG decoder,
# nvJPEG's CUDA decoder, its hybrid (Huffman on the CPU) one.
GPU_BACKENDS = ("HW_GPU_ONLY", "GPU_ONLY", "HYBRID_CPU_GPU")


class NvImageCodecJpegs:
    """blobs -> [uint8 [3, h, w] on `device`, or None where neither nvImageCodec nor PIL decodes it].
    `backends`: the BackendKind names a CUDA decoder may use, in order (a benchmark restricts it
    to one to learn which decodes the images). `cpu_threads`: the decoder's CPU threads
    (max_num_cpu_threads; None: the library's default, one per core of the machine)."""

    def __init__(self, device: torch.device, backends=GPU_BACKENDS, cpu_threads: Optional[int] = None):
        n = nvimgcodec_module()
        self._n, self.device = n, torch.device(device)
        if self.device.type == "cuda":
            index = self.device.index if self.device.index is not None else torch.cuda.current_device()
            kinds = [getattr(n.BackendKind, name) for name in backends]
            self.decoder = n.Decoder(device_id=index, backends=[n.Backend(kind) for kind in kinds],
                                     max_num_cpu_threads=cpu_threads or 0)
        else:
            self.decoder = n.Decoder(device_id=n.NVIMGCODEC_DEVICE_CPU_ONLY, backends=[n.Backend(n.BackendKind.CPU_ONLY)])
        self.params = n.DecodeParams(apply_exif_orientation=False, color_spec=n.ColorSpec.SRGB,
                                     allow_any_depth=False, sample_format=n.SampleFormat.P_RGB)

    def __call__(self, blobs: List[bytes]) -> List[Optional[torch.Tensor]]:
        return by_pil_where_missing(blobs, self.decoded(blobs), self.device)

    def decoded(self, blobs: List[bytes]) -> List[Optional[torch.Tensor]]:
        """What nvImageCodec itself decodes: None where it does not (PIL's, in __call__)."""
        out: List[Optional[torch.Tensor]] = [None] * len(blobs)
        at, streams = [], []
        for i, blob in enumerate(blobs):
            if blob[:2] != JPEG_MAGIC:
                continue
            try:
                streams.append(self._n.CodeStream(blob))  # parses the header
            except RuntimeError:  # not a JPEG it can read: PIL's
                continue
            at.append(i)
        if streams:
            cuda = self.device.type == "cuda"
            stream = torch.cuda.current_stream(self.device).cuda_stream if cuda else 0
            for i, image in zip(at, self.decoder.decode(streams, params=self.params, cuda_stream=stream)):
                if image is not None:
                    out[i] = torch.from_dlpack(image) if cuda else torch.from_numpy(np.array(image))
        return out
