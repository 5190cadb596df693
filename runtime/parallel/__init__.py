"""Parallelism on torch.distributed: ParallelContext (DeviceMesh), TensorPointer, pipeline, TP, DP."""

from runtime.parallel.tensor_pointer import TensorPointer

__all__ = ["TensorPointer"]
