"""Running a pool (``run``): the supervisor composed with the role it plays, ``serve``
(``serving``: the router, its control socket and their ``commands``) or ``workers`` (``host``:
local workers for a remote router). ``exposure`` says what the settings leave open.
"""
