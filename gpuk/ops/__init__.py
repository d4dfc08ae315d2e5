"""Graph ops, one module per op family; the op contract is in base.py."""
