"""Exceptions raised by the library. Only the CLI turns them into messages and exit codes."""


class GGUFBridgeError(Exception):
    """Base class: a problem the user can act on, described in one line."""


class CheckpointError(GGUFBridgeError):
    """The source checkpoint is missing, truncated, malformed or inconsistent."""


class HubError(CheckpointError):
    """A hub download failed: unknown repository, revision or file, no access, no network, or a checksum mismatch."""


class ConfigError(GGUFBridgeError):
    """config.json is unreadable or holds a value ggufbridge cannot convert."""


class UnsupportedArchitecture(ConfigError):
    """No converter is registered for the checkpoint's architecture."""


class TokenizerError(GGUFBridgeError):
    """The tokenizer files are missing or do not match what the runtime expects."""


class RuntimeNotFound(GGUFBridgeError):
    """No usable llama.cpp runtime (libraries or tools) was found."""


class PairingError(GGUFBridgeError):
    """A draft model does not fit its target."""


class RecipeError(GGUFBridgeError):
    """A hardware recipe (packaged or user TOML) is unknown or holds an invalid value."""


class ManifestError(GGUFBridgeError):
    """OUT_DIR/manifest.json is missing, malformed, or names files that are absent or the wrong size."""


class PlanError(GGUFBridgeError):
    """The model does not fit the recipe's memory budget with any allowed setting."""


class ServerError(GGUFBridgeError):
    """llama-server (or another launched tool) failed to start, died, or could not bind its port."""


class EvalDataError(GGUFBridgeError):
    """An eval set (JSONL rows or text file) is empty, malformed, or does not fit the context."""


class LogitsMismatch(GGUFBridgeError):
    """Two logit sources cannot be compared: different vocabularies, tokenizers, or token ids."""


class DeviceUnavailable(GGUFBridgeError):
    """A backend needs hardware (e.g. a CUDA GPU) or a package that this machine lacks."""


class GGUFFileError(GGUFBridgeError):
    """A GGUF file is unreadable, truncated or malformed."""


class VisionInputError(GGUFBridgeError):
    """An image (or video) cannot be used: unreadable, empty, unsupported format, or too large."""


class VisionModelError(GGUFBridgeError):
    """The mmproj and the text model do not fit together, or the vision runtime rejected an input."""


class QuantError(GGUFBridgeError):
    """A quantisation request is invalid (type, recipe, imatrix) or llama.cpp's quantiser failed."""


class OutputError(GGUFBridgeError):
    """An output file cannot be written (disk full, permissions), or OUT_DIR already holds a conversion."""


class NonFiniteWeights(CheckpointError):
    """Source weights hold NaN or Inf values."""
