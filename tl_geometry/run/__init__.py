"""Running an analysis: ``analyze`` over a model or cache, its results, checkpoints, shards,
comparisons, the run folder it writes and the tables derived jobs add to it."""
