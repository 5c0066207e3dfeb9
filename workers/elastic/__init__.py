"""Elastic training on Ray Train: sizes that keep the layout, the controller's settings,
its callbacks, and warm spare worker processes for fast restarts.

- :mod:`.settings`: Ray Train controller settings for elastic jobs.
- :mod:`.scaling`: the scaling policy that grows and shrinks in data parallelism only.
- :mod:`.callbacks`: worker failures as job events; a stale reservation released.
- :mod:`.warm_spares`: idle worker processes with the training stack imported.
"""
