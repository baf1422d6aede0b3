"""Exact-size page-locked host tensors (infcl_ds/data/decoding/pinned.py) and the batch assembled
ahead on a thread (infcl_ds/data/train_stream.py). The CUDA half runs where a GPU is (marked gpu:
`bash tests/run.sh --gpu`); on CPU the tensors are plain host memory."""
import gc

import pytest
import torch

from infcl_ds.data.decoding.pinned import pinned_empty

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="page-locking needs CUDA")


def test_plain_host_tensor_without_cuda():
    t = pinned_empty((3, 5, 7), torch.uint8)
    assert t.shape == (3, 5, 7) and t.dtype == torch.uint8 and t.device.type == "cpu"
    t.fill_(7)
    assert int(t.sum()) == 7 * 3 * 5 * 7
    assert pinned_empty((0, 4), torch.int64).numel() == 0


@pytest.mark.gpu
@cuda
def test_page_locked_exactly_and_copies_asynchronously():
    n = (1 << 20) * 3 + 5  # not a power of two: torch's pinned allocator would round it up
    host = pinned_empty((n,), torch.uint8)
    assert host.is_pinned()
    host.copy_(torch.randint(0, 256, (n,), dtype=torch.uint8))
    device = host.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(device.cpu(), host)
    # Views of it are page-locked too (HostBatch.chunk slices rows).
    assert host[17:1000].is_pinned()
    del host, device
    gc.collect()  # unregistered with the tensor; a new one registers again
    assert pinned_empty((n,), torch.uint8).is_pinned()


@pytest.mark.gpu
@cuda
def test_batches_assembled_ahead_are_page_locked():
    """Decoded host batches (encoded ones hold bytes: test_decode_queue.py checks the pinned window
    they are decoded into)."""
    from data_section import data_section
    from infcl_ds.data import build_train_data
    from infcl_ds.models import get_tokenizer
    torch.cuda.init()
    section = data_section({"source": "synthetic", "synthetic_size": 64, "workers": 0, "host_batch": "decoded"})
    data = build_train_data(section, rank=0, world_size=1, local_batch=16, seed=0, image_size=16,
                            tokenizer=get_tokenizer("ViT-B-32"))
    batches = list(data)
    assert len(batches) == 4 and all(b.images.is_pinned() and b.texts.is_pinned() for b in batches)
    images, texts = batches[1].chunk(0, 8, torch.device("cuda"), torch.bfloat16)
    assert images.is_cuda and images.dtype == torch.bfloat16 and torch.equal(texts.cpu(), batches[1].texts[:8])
