"""Sensors: wait for what a later stage needs (``checkpoint``: the final checkpoint, complete and valid)."""
