"""Launching the trainer: a spec, and the local gang that runs it on this host."""
