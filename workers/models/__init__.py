"""Model definitions; parallelism is applied from outside by ``workers.strategies``.

:mod:`.config` holds shapes and presets without torch (the control plane sizes
models with it); :mod:`.llama` is the decoder itself (its block in :mod:`.layers`, its
rotary tables in :mod:`.rope`); :mod:`.families` maps each Hugging Face family's
config.json onto it and :mod:`.hf_naming` its parameters to the family's names.
"""
