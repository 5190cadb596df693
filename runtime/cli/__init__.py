"""The runtime's command-line tools besides training: explain, evaluate, export (each parses, calls, reports)."""
