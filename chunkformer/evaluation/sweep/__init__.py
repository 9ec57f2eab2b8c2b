"""Periodicity sweeps: config, train / evaluate / resume / merge / rejudge, shards, files."""
