"""The tokenizer's part in the process's allocator policy (``pipelines.heap``, set by whoever starts
the process): ``trim()`` after each file group hands the Rust tokenizer's freed batch buffers back to
the kernel, so the peak stays set by one group, not by the corpus."""

from pipelines.heap import trim

__all__ = ["trim"]
