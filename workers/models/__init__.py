"""Model definitions; parallelism is applied from outside by ``workers.strategies``.

:mod:`.config` holds shapes and presets without torch (the control plane sizes
models with it); :mod:`.llama` is the decoder itself; :mod:`.hf_naming` maps its
parameters to Hugging Face Llama's.
"""
