"""Rendering of a judged sweep: markdown tables and figures of what it is given."""
