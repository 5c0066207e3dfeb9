"""Text generation from a fine-tuned model: a job's checkpoint or a Hugging Face folder.

:mod:`.params` (no torch) says what to generate and bounds it, for the CLI, the REST
route and this package alike; :mod:`.sampling` decodes (greedy, or top-p with a
temperature and a seed) on etrain's own decoder; :mod:`.load` builds that decoder from a
committed checkpoint (a LoRA one: its base plus the adapters) or a folder, and the
tokenizer; :mod:`.run` ties them together, in this process (``etrain generate``) or as
``python -m workers.generate`` reading one request on stdin (the service's way).
"""
