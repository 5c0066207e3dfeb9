"""Model definitions; parallelism is applied from outside by ``workers.strategies``.

Shapes and presets (``workers.models.config``) import without torch so the
service can size models; the modules themselves load on first use.
"""

from workers.models.config import PRESETS, ModelConfig, count_params, get_model_config

_TORCH_NAMES = ("Attention", "FeedForward", "RMSNorm", "Transformer", "TransformerBlock",
                "build_model")

__all__ = ["PRESETS", "ModelConfig", "count_params", "get_model_config", *_TORCH_NAMES]


def __getattr__(name: str):
    if name in _TORCH_NAMES:
        from workers.models import llama
        return getattr(llama, name)
    raise AttributeError(name)
