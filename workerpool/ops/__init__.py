"""What operators read: memory figures (``metrics``), the ``--http`` endpoint (``http``) and the
status document's worker rows (``worker_rows``).
"""
