"""Lowering rules, one module per op family; importing this package registers them all."""
