"""`infcl-ds bench loss [--loss clip|siglip] ...` (`python -m benchmarks.loss`): one loss on one
GPU against its baselines: the CLIP loss (clip.py, the default) or the sigmoid loss (siglip.py)."""
from . import clip, siglip
from .harness import by_loss


def main(argv=None):
    return by_loss(argv, clip=clip.main, siglip=siglip.main)


if __name__ == "__main__":
    main()
