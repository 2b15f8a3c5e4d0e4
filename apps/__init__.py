"""The applications on top of the library: the ``hetero-replay`` command and comparison runs.

Nothing in the core or in :mod:`hetero_replay.adapters` imports this package.
"""
