"""The processes that hold a model: the worker (``main``, answering with ``requests``, its
memory kept within ``--max-worker-memory`` by ``memory_bound``), started from a typed ``spec``, and the warm template (``template``) that forks workers; ``child`` is how
either starts fresh. Importing this package loads none of them, so the supervisor can read
``spec`` alone.
"""
