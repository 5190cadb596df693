"""From the data order to torch batches: the feed (a step's micro-batches on every rank), the batch contract, the
sources of loaders, the stage dataset, sampler, collators, loaders, prefetch, tp broadcast."""
