"""The domain: what the service decides and does with jobs, independent of HTTP.

- :mod:`.submission`: validate, plan and store new jobs; dry runs; the cluster's shape.
- :mod:`.queries`: reads of jobs, their telemetry, logs and goodput, per tenant.
- :mod:`.lifecycle`: cancel. :mod:`.ingest`: the workers' telemetry.
- :mod:`.reconciler`: admits queued jobs (:mod:`.scheduler`) and follows running ones
  (:mod:`.recovery`). :mod:`.states`: the status rule and ``change_status``.
- :mod:`.validation`, :mod:`.storage_check`: 422s that name the field to change.
- :mod:`.goodput`, :mod:`.job_metrics`: what the stored telemetry adds up to;
  :mod:`.monitoring`: readiness and the job counts of a scrape.
"""
