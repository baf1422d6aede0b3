"""The recipe's data section (config/recipe.py, DataSection) from the keys a test sets, as the
trainer hands it to the data layer: its `auto` values resolved, data.keep_decoded_gib to 0
(decode in both passes), data.keep_decoded_host_gib to 0, data.decode_workers to 2, data.decoder
to pil and data.decode_window_gib to 1 (as on a CPU rank) unless the test sets them."""
from infcl_ds.config.recipe import DataSection


def data_section(spec: dict) -> DataSection:
    return DataSection.model_validate({"keep_decoded_gib": 0.0, "keep_decoded_host_gib": 0.0, "decode_workers": 2,
                                       "decoder": "pil", "decode_window_gib": 1.0, **spec})
