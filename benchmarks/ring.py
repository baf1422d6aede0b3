"""`infcl-ds bench ring [--loss clip|siglip] ...` (`python -m benchmarks.ring`): one loss over a
ring of this host's GPUs against its baselines: the CLIP loss (clip_ring.py, the default) or the
sigmoid loss (siglip_ring.py)."""
from . import clip_ring, siglip_ring
from .harness import by_loss


def main(argv=None):
    return by_loss(argv, clip=clip_ring.main, siglip=siglip_ring.main)


if __name__ == "__main__":
    main()
