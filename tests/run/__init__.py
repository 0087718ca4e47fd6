"""The analysis over a model or cache, its results, checkpoints, shards and run folders."""
