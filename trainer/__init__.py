"""The program that runs inside each training pod (or local gang node).

Imports torch, numpy, safetensors and the standard library only: the image stays small and a
pod needs no tracking credentials. Rank 0 writes ``status.json`` and ``metrics.jsonl``; the
orchestrator ships them onward.
"""
