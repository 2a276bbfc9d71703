"""What the pool asks of Linux: ``controls`` over this process (``prctl(2)``, glibc's
``malloc_trim``), ``procfs``, the one reader of what /proc says of processes (their memory,
their mappings, their children), and ``cpus``, how many CPUs this process may use.
"""
