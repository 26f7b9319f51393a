"""Triggers: the waiting that runs in the triggerer (``gang``: a local gang; ``kubernetes``: a gang's Job)."""
