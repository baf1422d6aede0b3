"""Where samples come from: WebDataset shards and their tar index, a CSV, synthetic samples (a
source: samples.py), the source a recipe names (from_recipe.py), and the sampler that orders them."""
