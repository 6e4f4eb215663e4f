"""Typed, validated reads of config.json values: errors name the key, the expected and the found value."""

from __future__ import annotations

import math
from typing import Any

from ggufbridge.errors import ConfigError
from ggufbridge.units import INT32_MAX

REQUIRED = object()
INT64_MAX = 2**63 - 1


def _short(val: Any) -> str:
    """A found value for a message: an integer of hundreds of digits is cut."""
    text = repr(val)
    return text if len(text) <= 60 else text[:40] + f"… ({len(text)} characters)"


class Cfg:
    """A view of one (sub-)dict of config.json, with a dotted path for messages."""

    def __init__(self, data: dict, where: str = "config.json"):
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: expected a JSON object, found {type(data).__name__}")
        self.data = data
        self.where = where

    def sub(self, key: str) -> "Cfg":
        val = self.data.get(key)
        if val is None:
            raise ConfigError(f"{self.where}: missing required section {key!r}")
        return Cfg(val, f"{self.where}:{key}")

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def get(self, key: str, typ: type, default: Any = REQUIRED, *, bits: int = 64) -> Any:
        val = self.data.get(key)
        if val is None:
            if default is REQUIRED:
                raise ConfigError(f"{self.where}: missing required key {key!r} ({typ.__name__})")
            return default
        # The JSON reader judges no values (ggufbridge.untrusted): a number read here is a number used, so it is
        # judged here, by key: an int must fit 64 bits, a float must be finite (int(1e30) as a float is fine).
        if typ is float and isinstance(val, int) and not isinstance(val, bool) and abs(val) <= INT64_MAX:
            val = float(val)
        if typ is int and isinstance(val, bool) or not isinstance(val, typ):
            raise ConfigError(f"{self.where}: {key} must be {typ.__name__}, found {_short(val)}")
        if typ is int and bits == 64 and not -INT64_MAX <= val <= INT64_MAX:
            raise ConfigError(f"{self.where}: {key} must be an integer of at most 64 bits, found {_short(val)}")
        if typ is float and not math.isfinite(val):
            raise ConfigError(f"{self.where}: {key} must be a finite number, found {val}")
        return val

    def positive(self, key: str, default: Any = REQUIRED) -> int:
        val = self.get(key, int, default, bits=32)  # its own, narrower bound below
        if val <= 0:
            raise ConfigError(f"{self.where}: {key} must be a positive integer, found {_short(val)}")
        # sizes and counts become GGUF uint32/int32 keys and C ints in the runtime
        if val > INT32_MAX:
            raise ConfigError(f"{self.where}: {key} must be at most {INT32_MAX}, found {_short(val)}")
        return val

    def positive_float(self, key: str, default: Any = REQUIRED) -> float:
        """A finite number > 0 (epsilons, rope bases): 0, negatives, NaN and Inf would only show as NaN logits."""
        val = self.get(key, float, default)
        if not (math.isfinite(val) and val > 0):
            raise ConfigError(f"{self.where}: {key} must be a positive number, found {val}")
        return val

    def expect(self, key: str, want: Any, default: Any = REQUIRED) -> Any:
        val = self.data.get(key, default)
        if val is REQUIRED:
            raise ConfigError(f"{self.where}: missing required key {key!r} (expected {want!r})")
        if val != want:
            raise ConfigError(f"{self.where}: {key} must be {want!r}, found {val!r}")
        return val


def check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)
