"""The supervisor (arbiter): keeps the workers alive around one event loop (``loop``), starts
them (``starters``, ``template_starter``), tracks them (``process``), takes signals
(``signals``) and tells the world (``ready_line``, ``systemd``). ``core`` holds the
``Supervisor``, ``role`` what it asks of ``serve`` or ``workers``; nothing here imports
asyncio, ssl or a model.
"""
