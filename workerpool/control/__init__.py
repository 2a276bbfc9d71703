"""The control socket: ``call`` asks a running server (``client``), the supervisor answers
(``server``), and ``status`` is the document it answers ``status`` with. Importing this package
loads none of them: the supervisor reads ``status`` without loading the client's asyncio."""
