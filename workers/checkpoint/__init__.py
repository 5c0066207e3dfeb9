"""Checkpoints: sharded saves with a commit protocol, where they are stored, when they are
taken, which are kept, and export.

- :mod:`.manager`: save, commit, list, load and prune (retention) of one job's checkpoints;
  :mod:`.state`: what a checkpoint holds per rank.
- :mod:`.async_save`: saves that write in the background; :mod:`.loop`: the train loop's
  side (when to save, sync or async, what to report); :mod:`.interval`: the automatic
  interval policy; :mod:`.retention`: the rule for which checkpoints are kept.
- :mod:`.storage`: ``file://``, ``s3://``, ``gs://`` locations and their credentials;
  :mod:`.probe`: the write check before a job runs; :mod:`.dcp_io` and
  :mod:`.local_writer`: DCP readers and writers.
- :mod:`.export`: a committed checkpoint as safetensors.

``storage``, ``probe``, ``retention`` and ``interval`` import no torch: the control plane
uses them. Importing this package imports none of its modules.
"""
