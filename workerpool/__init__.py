"""workerpool: serve a numpy model from many processes that share one mapped copy of its weights."""

__version__ = "0.1.0"
