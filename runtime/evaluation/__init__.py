"""Evaluation during training: multiple-choice tasks scored by log-likelihood (``tasks``, ``scoring``), the user's
hooks (``hooks``), and when to run them (``evaluator``). See docs/evaluation.md."""
