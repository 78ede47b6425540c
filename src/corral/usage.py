"""Token use a provider reported (pure): counted by the broker, shown by adapters."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["TokenUsage", "token_count"]


def token_count(value: object) -> int:
    """A reported count as a non-negative int; bools, floats, strings, negatives are 0."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return 0
    return value


@dataclass(frozen=True, slots=True)
class TokenUsage:
    """Tokens a provider reported; `total` (input + output) is what budgets count."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    @property
    def total(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cache_read_tokens + other.cache_read_tokens,
            self.cache_write_tokens + other.cache_write_tokens,
        )

    def maximum(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(
            max(self.input_tokens, other.input_tokens),
            max(self.output_tokens, other.output_tokens),
            max(self.cache_read_tokens, other.cache_read_tokens),
            max(self.cache_write_tokens, other.cache_write_tokens),
        )

    def to_json_dict(self) -> dict[str, int]:
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cache_read_tokens": self.cache_read_tokens,
            "cache_write_tokens": self.cache_write_tokens,
        }

    @classmethod
    def from_json_dict(cls, d: Mapping[str, Any]) -> TokenUsage:
        return cls(
            token_count(d.get("input_tokens")),
            token_count(d.get("output_tokens")),
            token_count(d.get("cache_read_tokens")),
            token_count(d.get("cache_write_tokens")),
        )
