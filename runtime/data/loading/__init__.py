"""From the data order to torch batches: the stage dataset, sampler, collators, loaders, prefetch, tp broadcast."""
