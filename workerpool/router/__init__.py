"""The router: clients on one ROUTER socket, workers on another, and what lies between. A
socket-free core (``core``: ``intake`` admits, the ``scheduler`` owns every worker's state and
hands out what the ``backlog`` holds (a queue per model, ``queue``), asking the rules of
``eligible``, ``recovery``, ``rollout`` and ``batching``; ``replies`` and ``stats`` count; what is
to be sent goes in an ``outbox``) and its shell (``links``: the sockets, ``sockets`` binds them;
``connections``: the cap on client connections).
"""
