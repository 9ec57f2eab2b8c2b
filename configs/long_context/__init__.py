"""Sweeps at long context, each row's tokens split over devices (mesh.context)."""
