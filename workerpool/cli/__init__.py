"""The ``workerpool`` command line."""
