"""The runtime's command-line tools besides training: explain, export, and validate (``python -m runtime.evaluate``);
each parses, calls, reports."""
