"""Reading upstream checkpoints: safetensors shards (untrusted), config, tokenizer files."""

from ggufbridge.checkpoint.model_dir import ModelDir, resolve_model_dir
from ggufbridge.checkpoint.safetensors import TensorRef

__all__ = ["ModelDir", "TensorRef", "resolve_model_dir"]
