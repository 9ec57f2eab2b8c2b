"""Probes: a trained or loaded model in, correctness matrices and typed record fields out."""
