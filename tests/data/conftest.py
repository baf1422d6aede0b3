"""Fixtures of the data tests: a tokenizer, the digits dataset, and shards of id images
(tests/id_samples.py), each built once per test module; tar indexes go to a temporary cache."""
import open_clip
import pytest

from id_samples import ID_SHARD_SIZES, id_image, write_shard

from infcl_ds.data.commands.digits import build_digits


@pytest.fixture(scope="module", autouse=True)
def index_cache(tmp_path_factory):
    """Tar indexes go to a temporary cache, not ~/.cache."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("INFCL_DS_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.fixture(scope="module")
def tokenizer():
    return open_clip.tokenizer.SimpleTokenizer(context_length=16)


@pytest.fixture(scope="module")
def digits_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("digits")
    build_digits(out, image_size=32, seed=0)
    return out


@pytest.fixture(scope="module")
def id_shards(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ids")
    first = 0
    for s, size in enumerate(ID_SHARD_SIZES):
        write_shard(folder / f"shard-{s:06d}.tar",
                    [{"__key__": f"{i:09d}", "png": id_image(i), "txt": f"sample {i}"}
                     for i in range(first, first + size)])
        first += size
    return folder
