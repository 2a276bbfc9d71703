"""The wire: how messages are framed (``messages``, with the ``route`` frame the router reads
and the shared ``terms``), how sockets carry them (``transport``), and whether a server is there
at all (``reach``). The router, the workers and the clients all speak it; it knows nothing of
any of them.
"""
