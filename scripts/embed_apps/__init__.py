"""The peers of ``scripts/embed_http_bench.py``: sentence-embedding apps a user would write."""
