"""What a run records of its steps: the step observers the trainer calls after each step (metrics rows, spikes,
adaptive mixing, the divergence guard), their logs (one jsonl helper) and the tools that read them. Importing this
package imports nothing: ``nanoset metrics`` reads the logs without torch."""
