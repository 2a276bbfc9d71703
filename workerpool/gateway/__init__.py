"""The HTTP front door (``serve --http``), on the supervisor's own poll loop: its requests go
to the router in-process as a ZeroMQ client's would, their bodies unread (the workers decode
them: ``workerpool.codecs``).

- ``http11``: HTTP/1.1 framing with httptools, socket-free: bytes in, requests or refusals out.
- ``routes``: what each request is answered, socket-free: a response, or a call to the router.
- ``server``: the listening socket, the connection cap, lingering closes, the exit.
- ``connection``: one connection's reading, answering in order and writing, TLS included.
"""
