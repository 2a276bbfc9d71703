"""The router: clients on one ROUTER socket, workers on another, and what lies between. A
socket-free core (``core``: intake, registry, dispatch and batching, recovery and quarantine,
rollout, stats, which put what is to be sent in an ``outbox``) and its shell (``links``: the
sockets, ``sockets`` binds them; ``connections``: the cap on client connections).
"""
