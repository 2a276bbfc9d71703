"""What the scripts in ``scripts/`` and ``scripts/checks/`` share: servers to start and stop,
load drivers, memory and CPU figures, scratch runs and their command lines.

Entry points live beside this package, never in it, and import from it alone: no script imports
another. ``python scripts/X.py`` finds it on ``sys.path`` by itself; a script in
``scripts/checks/`` puts ``scripts/`` there first.
"""
