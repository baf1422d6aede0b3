"""Files the package reads that live at the repository's top level: the DeepSpeed base configs
(ds_configs/) and the measured rates (docs/benchmarks/). From a checkout or an editable install
they are read where they are; a regular `pip install .` copies them to
PREFIX/share/infcl_ds/ (setup.cfg's data_files), which is the fallback."""
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
INSTALLED = Path(sys.prefix) / "share" / "infcl_ds"


def resource(*parts: str) -> Path:
    """REPO/parts if it exists, else PREFIX/share/infcl_ds/parts (returned even if missing,
    so that the caller's error names the checkout's path)."""
    in_repo = REPO.joinpath(*parts)
    if in_repo.exists():
        return in_repo
    installed = INSTALLED.joinpath(*parts)
    return installed if installed.exists() else in_repo
