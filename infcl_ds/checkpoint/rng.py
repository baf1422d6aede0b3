"""Every RNG stream of a rank (Python's, numpy's, torch's, CUDA's) as tensors, numbers and
strings: saved in the rank's client state and readable with ``weights_only=True``."""
import random
from typing import Any, Dict

import numpy as np
import torch


def rng_state() -> Dict[str, Any]:
    """Every RNG stream as tensors, numbers and strings: readable with weights_only=True."""
    version, mt_state, gauss = random.getstate()
    numpy_state = np.random.get_state(legacy=False)
    state = {"python": [version, list(mt_state), gauss],
             "numpy": {"bit_generator": numpy_state["bit_generator"],
                       "key": torch.from_numpy(numpy_state["state"]["key"].astype(np.int64)),
                       "pos": int(numpy_state["state"]["pos"]), "has_gauss": int(numpy_state["has_gauss"]),
                       "gauss": float(numpy_state["gauss"])},
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: Dict[str, Any]) -> None:
    version, mt_state, gauss = state["python"]
    random.setstate((version, tuple(mt_state), gauss))
    numpy_state = state["numpy"]
    np.random.set_state({"bit_generator": numpy_state["bit_generator"],
                         "state": {"key": numpy_state["key"].numpy().astype(np.uint32), "pos": numpy_state["pos"]},
                         "has_gauss": numpy_state["has_gauss"], "gauss": numpy_state["gauss"]})
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
