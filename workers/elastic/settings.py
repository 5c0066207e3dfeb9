"""Ray Train controller settings (``bench/recovery.py`` measures them against Ray's
defaults): a 0.5 s health poll for every job, the rest for elastic jobs.

The driver sets them unless the job's environment does; Ray propagates them from the
driver to its controller.
"""

from __future__ import annotations

import os

# How often a healthy elastic job checks whether more workers could run (Ray's default,
# 60 s, lets a joined node idle for a minute before the group grows).
RESIZE_MONITOR_INTERVAL_ENV = "ETRAIN_RESIZE_MONITOR_INTERVAL_S"
DEFAULT_RESIZE_MONITOR_INTERVAL_S = 5.0

# Every job: poll the workers every 0.5 s, not every 2 s. A failure is seen at the next
# poll, and a poll waits up to this long for workers that do not answer (those of a node
# that just died), so this bounds failure detection twice; the end of training is seen
# at the next poll too (1 s of every job's end, on average, at Ray's 2 s). Each poll is
# one small call per worker, and a slow answer is only waited for again.
CONTROLLER_ENV = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5"}

# Elastic jobs also:
#  - a worker whose health poll hangs 30 s (node unreachable, not dead) is lost,
#    not after Ray's 10 minutes;
#  - wait 5 s, not 60 s, for a worker group's resources: an elastic group is
#    sized from reserved resources, so a longer wait only means they were stale
#    (a node just died) and a retry at the size now available is the fix.
#    Start timeouts do not count against failure.max_failures.
ELASTIC_CONTROLLER_ENV = {
    **CONTROLLER_ENV,
    "RAY_TRAIN_WORKER_HEALTH_CHECK_TIMEOUT_S": "30",
    "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "5",
}


def resize_monitor_interval_s() -> float:
    """The resize monitor's period: ``$ETRAIN_RESIZE_MONITOR_INTERVAL_S`` or 5 s."""
    return float(os.environ.get(RESIZE_MONITOR_INTERVAL_ENV, DEFAULT_RESIZE_MONITOR_INTERVAL_S))


def apply_controller_env(*, elastic: bool) -> None:
    """Set the controller settings for a job, elastic or not, in this (driver) process,
    unless already set."""
    for key, value in (ELASTIC_CONTROLLER_ENV if elastic else CONTROLLER_ENV).items():
        os.environ.setdefault(key, value)
