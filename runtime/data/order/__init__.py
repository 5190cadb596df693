"""The data order as a pure function of (config, step), in numpy alone (no torch): see docs/data-order.md."""
