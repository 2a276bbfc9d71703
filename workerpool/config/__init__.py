"""Every setting of a pool, each declared once (``settings``), and the typed configurations the
running pool reads (``pool``). ``values`` parses a setting's text, ``sources`` reads settings
from a file and the environment, ``docs`` writes their tables in docs/configuration.md.
"""
