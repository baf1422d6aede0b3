"""data.gpu_jpeg_library=nvimgcodec (data/decoding/nvimgcodec_decode.py), run here with
nvImageCodec's CPU decoder (libjpeg-turbo, as torchvision's CPU decoder and PIL): the same images as
torchvision's decode_jpegs, blob by blob, the same pieces and replaced rows through the GPU
decoder's path, and one line naming the extra where the library is missing."""
import io
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from encoded_shards import SAMPLES, both_passes, first_batch, photo_jpeg, write_shard
from launch_utils import data_check
from test_first_day_errors import _one_line
from infcl_ds.data import DataError
from infcl_ds.data.decoding.device_decode import decode_jpegs

pytest.importorskip("nvidia.nvimgcodec", reason="the test extra installs nvImageCodec (setup.cfg)")


def _blobs():
    """Photos as JPEG (4:2:0 and 4:4:4), a grayscale JPEG, a PNG, a JPEG cut short and bytes
    that start like a JPEG and are none."""
    rng = np.random.default_rng(3)
    photos = [photo_jpeg(i, rng) for i in range(6)]
    pixels = np.asarray(Image.open(io.BytesIO(photos[0])))

    def saved(array, **kwargs):
        buf = io.BytesIO()
        Image.fromarray(array).save(buf, **kwargs)
        return buf.getvalue()

    return photos + [saved(pixels, format="JPEG", subsampling=0), saved(pixels[..., 0], format="JPEG"),
                     saved(pixels, format="PNG"), photos[1][:len(photos[1]) // 3], b"\xff\xd8 not a jpeg"]


def test_the_images_equal_torchvisions_blob_by_blob():
    from infcl_ds.data.decoding.nvimgcodec_decode import NvImageCodecJpegs
    blobs = _blobs()
    got, want = NvImageCodecJpegs(torch.device("cpu"))(blobs), decode_jpegs(blobs, "cpu")
    # The truncated JPEG: libjpeg-turbo in torchvision stops with an error, PIL (the fallback of
    # both) too; the bytes that are no JPEG: neither decodes them.
    assert [g is None for g in got] == [w is None for w in want] == [False] * 9 + [True, True]
    for g, w in zip(got, want):
        if w is not None:
            assert g.dtype == torch.uint8 and g.shape == w.shape and g.shape[0] == 3
            assert torch.equal(g, w)


def test_decoded_says_what_the_library_decoded_itself():
    """decoded(): nvImageCodec's own images, None where it passes one on (the PNG, the cut-short
    JPEG, the non-JPEG), which the decoder's call then hands to PIL: what a benchmark counts to
    learn which backend decodes the images."""
    from infcl_ds.data.decoding.nvimgcodec_decode import NvImageCodecJpegs
    blobs = _blobs()
    jpegs = NvImageCodecJpegs(torch.device("cpu"))
    own, full = jpegs.decoded(blobs), jpegs(blobs)
    assert [o is None for o in own] == [False] * 8 + [True] * 3
    assert full[8] is not None and all(torch.equal(o, f) for o, f in zip(own[:8], full[:8]))


def test_the_gpu_decoders_pieces_and_replacements_equal_torchvisions(tmp_path, tokenizer):
    corrupt = (3, 35)
    bad = write_shard(tmp_path / "bad.tar", corrupt=corrupt)
    runs = {}
    for library in ("torchvision", "nvimgcodec"):
        batch = first_batch(bad, tokenizer, "encoded", decoder="nvjpeg", gpu_jpeg_library=library)
        runs[library] = (both_passes(batch, chunk=10), batch.decode_skipped)
    (passes, skipped), (want, want_skipped) = runs["nvimgcodec"], runs["torchvision"]
    assert skipped == want_skipped == len(corrupt)
    for pass_got, pass_want in zip(passes, want):
        assert len(pass_got) == len(pass_want) == SAMPLES // 10
        for (im, tx), (im_want, tx_want) in zip(pass_got, pass_want):
            assert torch.equal(im, im_want) and torch.equal(tx, tx_want)


def test_a_missing_library_is_one_line_naming_the_extra(monkeypatch, capsys):
    from infcl_ds.config import Recipe
    from infcl_ds.training.resolve import check_decoder
    monkeypatch.setitem(sys.modules, "nvidia.nvimgcodec", None)  # as if not installed
    recipe = Recipe.model_validate({"data": {"source": "webdataset", "train": "x", "decoder": "nvjpeg",
                                             "gpu_jpeg_library": "nvimgcodec"}})
    with pytest.raises(DataError) as err:
        check_decoder(recipe, torch.device("cuda", 0))
    assert "\n" not in str(err.value)
    assert "nvImageCodec, which is not installed: pip install 'infcl_ds[gpu-decode]'" in str(err.value)
    # torchvision's binding needs nothing more; the CPU decoders never ask.
    check_decoder(Recipe.model_validate({"data": {"source": "webdataset", "train": "x", "decoder": "nvjpeg"}}),
                  torch.device("cuda", 0))
    check_decoder(Recipe.model_validate({"data": {"source": "webdataset", "train": "x",
                                                  "gpu_jpeg_library": "nvimgcodec"}}), torch.device("cpu"))
    # `infcl-ds data check` refuses it before a launch, in the trainer's words; with decoder=auto
    # too, which a GPU rank may resolve to hybrid.
    for decoder in ("nvjpeg", "hybrid", "auto"):
        code, out = data_check(capsys, "data.source=synthetic", f"data.decoder={decoder}",
                               "data.gpu_jpeg_library=nvimgcodec")
        assert code == 2 and _one_line(out.err) == f"infcl-ds data check: {err.value}"
    assert data_check(capsys, "data.source=synthetic", "data.decoder=pil", "data.gpu_jpeg_library=nvimgcodec")[0] == 0


def test_the_recipe_names_the_libraries():
    from infcl_ds.config import Recipe
    from pydantic import ValidationError
    with pytest.raises(ValidationError, match="torchvision.*nvimgcodec"):
        Recipe.model_validate({"data": {"gpu_jpeg_library": "dali"}})
