"""What runs report: per-step metrics, events and checkpoints (:mod:`.reporter`), the
memory each rank measures (:mod:`.memory`), and what rank 0 also writes elsewhere
(:mod:`.outputs`: TensorBoard files, MLflow and W&B runs)."""
