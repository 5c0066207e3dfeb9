"""Elastic training on Ray Train: sizes that keep the layout, the controller's settings
and its callbacks (warm processes for fast starts live in :mod:`workers.warm`).

- :mod:`.settings`: Ray Train controller settings for elastic jobs.
- :mod:`.scaling`: the scaling policy that grows and shrinks in data parallelism only.
- :mod:`.callbacks`: worker failures as job events; a stale reservation released.
- :mod:`.node_spares`: a joining node gets spare workers at once and a resize now.
"""
