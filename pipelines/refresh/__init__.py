"""Incremental refresh: new data batches land, the champion is trained further on them (docs/refresh.md)."""
