"""Where a job's files live, and the one way they are opened.

- :mod:`.location`: a URI (``file://``, ``s3://``, ``gs://``) as a store, with its
  credentials (checkpoints, models, tokenizers, datasets, prepared shards, TensorBoard
  and export all reach object stores through it); :mod:`.credentials`: where a store's
  keys come from (variable names) and the fsspec options built from them; :mod:`.probe`:
  the write check before a job runs.
- :mod:`.confine`: local files opened beneath the roots a tenant may use, checked at
  the moment of use, component by component, on the node that opens them.

Importing this package imports none of its modules; none of them imports torch.
"""
