"""What the generation settings mean (``Settings`` field descriptions; the settings
reference in docs/ is generated from them): POST /v1/jobs/{id}/generate,
``service/domain/generation.py``."""

GENERATE_ENABLED = (
    "Serve POST /v1/jobs/{id}/generate: text from a finished job's checkpoint, generated in a "
    "child process of the service (python -m workers.generate) on its CPU; off = a 403."
)
GENERATE_TOKENS = (
    "Most new tokens one generate request may ask for (max_new_tokens); more is a 422 "
    "naming the field."
)
GENERATE_TIMEOUT = (
    "Seconds one generation may take, loading the model included: decoding stops short of "
    "it (stop_reason time) and a process still running at it is killed (a 504)."
)
GENERATE_CONCURRENCY = (
    "Generations running at once (each a process holding its model in memory); one more is a 429."
)
