"""Shards whose samples say who they are, and helpers to build and read the training stream, for
the data tests (tests/data/conftest.py writes the shards as fixtures).

Sample identity: `id_image(i)` is an image of one flat colour encoding the sample id
(R + 256 G), which the val transform (resize to the same size, center crop) keeps exactly;
`ids_of` reads the ids back from a batch."""
import tarfile

import webdataset as wds
from PIL import Image

from data_section import data_section

from infcl_ds.data import build_train_data

ID_SHARD_SIZES = (7, 13, 3)  # uneven on purpose
NUM_IDS = sum(ID_SHARD_SIZES)


def id_image(i: int) -> Image.Image:
    return Image.new("RGB", (8, 8), (i % 256, i // 256, 0))


def write_shard(path, samples):
    """samples: dicts of member ext -> content (PIL image, bytes or str), "__key__" included."""
    with wds.TarWriter(str(path)) as sink:
        for sample in samples:
            sink.write(sample)


def ids_of(batch):
    images, _ = batch.decoded(0, len(batch))
    return (images[:, 0, 0, 0].long() + 256 * images[:, 1, 0, 0].long()).tolist()


def build(spec, tokenizer, *, rank=0, world_size=1, local_batch=4, seed=0, image_size=8, **kw):
    return build_train_data(data_section(spec), rank=rank, world_size=world_size, local_batch=local_batch, seed=seed,
                            image_size=image_size, tokenizer=tokenizer, **kw)


def id_spec(folder, **kw):
    return {"source": "webdataset", "train": str(folder), "augment": False, "workers": 0, **kw}


def epoch_ids(data, epoch):
    data.set_epoch(epoch)
    return [ids_of(b) for b in data]


def read_tar(path):
    """{key: {ext: bytes}} of one shard."""
    samples = {}
    with tarfile.open(path) as tar:
        for m in tar.getmembers():
            key, ext = m.name.split(".", 1)
            samples.setdefault(key, {})[ext] = tar.extractfile(m).read()
    return samples
