"""Warm start: processes started before a job or a worker group needs them.

One name for the two start-up speed-ups, each ahead of a different wait:

- :mod:`.standby`: a *standby driver*, a Ray job the service starts before any etrain job
  exists; it imports the training stack, connects and starts Ray Train's controller, then
  asks the service for its job (the service side is ``service.backends.standby``).
- :mod:`.spares`: *spare workers*, idle Ray worker processes with torch, Ray Train and
  etrain imported, which the next worker group of the job claims instead of starting
  fresh processes (first group, restarts after a failure, and resizes).
- :mod:`.waves`: starts spares in waves that leave the cores to whoever is waiting.
- :mod:`.speculation`: imports ahead of a job a standby does not have yet pause while
  another job runs on the machine.
- :mod:`.first_group`: a job's first worker group started ahead by its driver, as spares are.
- :mod:`.startup_times`: where a start's seconds went, reported as job events.
"""
