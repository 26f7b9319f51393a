"""Evaluation of a checkpoint against a baseline: scores, the gate, the report."""
