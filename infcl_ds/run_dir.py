"""A run directory's layout (the recipe's output_dir): the name of everything the trainer writes
directly inside it. The trainer, its start-up checks, the metrics logger, the run lock, the
checkpoints, export and eval read the names here; this module imports nothing of the package.

What is inside ``checkpoints/`` (tags, the ``latest`` pointer, each tag's files) is the
checkpoint package's.
"""
CHECKPOINTS = "checkpoints"   # the checkpoint tags
RECIPE = "recipe.yaml"        # the run's recipe, `auto` values kept (each tag holds a copy too)
RUN_INFO = "run.json"         # world size, device, model, local batch, steps per epoch
METRICS = "metrics.csv"       # one row per logged step (rank 0)
EVAL_CSV = "eval.csv"         # one row per evaluation
EVAL_JSON = "eval.json"       # the final evaluation
PLOT = "metrics.png"          # metrics.csv and eval.csv drawn
TENSORBOARD = "tensorboard"   # logging.tensorboard's events
LOCK_FILE = ".infcl-ds.lock"  # the live run's lock (training/run_lock.py)

# Every name the trainer writes directly inside output_dir: what --restart moves aside (not the
# lock file: the restarting run holds it).
RUN_FILES = (CHECKPOINTS, METRICS, EVAL_CSV, EVAL_JSON, PLOT, TENSORBOARD, RECIPE, RUN_INFO)
