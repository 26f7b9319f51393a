"""Hooks: calls to external systems the provider hooks do not offer (``kubernetes``: a gang's Jobs and pods)."""
