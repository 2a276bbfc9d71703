"""The event loop (``loop``) every part of a running pool reacts on: the supervisor, the
router's sockets, the control socket and the HTTP front door each hand it their sources and
duties. It sits below them all, so none of them imports another for it.
"""
