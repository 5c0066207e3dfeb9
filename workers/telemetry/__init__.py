"""What runs report: per-step metrics, events and checkpoints (:mod:`.reporter`), and the
memory each rank measures (:mod:`.memory`)."""
