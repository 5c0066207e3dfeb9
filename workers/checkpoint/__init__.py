"""Checkpoints: sharded saves with a commit protocol, where they are stored, when they are
taken, which are kept, and export.

- :mod:`.manager`: save, commit, list, load and prune (retention) of one job's checkpoints;
  :mod:`.state`: what a checkpoint holds per rank.
- :mod:`.async_save`: saves that write in the background; :mod:`.loop`: the train loop's
  side (when to save, sync or async, what to report); :mod:`.interval`: the automatic
  interval policy; :mod:`.retention`: the rule for which checkpoints are kept.
- :mod:`.dcp_io` and :mod:`.local_writer`: DCP readers and writers on a store of
  :mod:`workers.storage` (where checkpoints live, and the check before a job runs).
- :mod:`.export`: a committed checkpoint as safetensors.

``retention`` and ``interval`` import no torch: the control plane
uses them. Importing this package imports none of its modules.
"""
