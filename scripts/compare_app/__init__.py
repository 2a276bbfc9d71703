"""The gunicorn side of ``scripts/compare.py``: a WSGI app serving a workerpool model."""
