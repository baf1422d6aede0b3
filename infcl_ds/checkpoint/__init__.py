"""A run's checkpoints: what a tag holds, how it is written, found, verified and read.

Below training, eval and export, which import it; it imports none of them, nor the engine
(it is handed a DeepSpeed engine, and only calls it). One job a module:

- ``store.py``: save a tag (every rank; atomic, a failure on one rank fails all) and load one
  (the engine, this rank's client state);
- ``tags.py``: the ``latest`` pointer, intact and unfinished tags, resolving the tag a command
  names, removing and pruning tags;
- ``manifest.py``: every file's size and SHA-256, written with a tag and verified before it is read;
- ``safe_load.py``: reading checkpoint files weights-only, ``CheckpointError``, ``--trust-checkpoint``;
- ``reshard.py``: resuming on another number of ranks (DeepSpeed's universal checkpoint);
- ``rng.py``: a rank's RNG streams as data a weights-only read takes;
- ``state_mismatch.py``: weights that do not fit the model, said in one line;
- ``atomic.py``: a file replaced whole or not at all.

Who owns a run (its lock, ``training/run_lock.py``) is the caller's to say: ``tags.resolve_tag(...,
owner=...)``.
"""
