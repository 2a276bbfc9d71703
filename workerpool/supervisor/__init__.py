"""The supervisor (arbiter): keeps the workers alive on the pool's event loop
(``workerpool.events``), starts them (``starters``, ``template_starter``), counts them
(``headcount``), tracks them (``process``), takes signals (``signals``) and tells the world
(``ready_line``, ``systemd``). ``core`` holds the ``Supervisor``, ``role`` what it asks of
``serve`` or ``workers``; nothing here imports asyncio, ssl or a model.
"""
