"""The pretraining sweep of the periodic weak-spots study (see runs.py)."""
