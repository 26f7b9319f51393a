"""What every config section shares: a frozen pydantic model that refuses unknown fields, the
error that names every bad field by its dotted path, and the constrained number types."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from pipelines.errors import BadInput

PositiveInt = Annotated[int, Field(gt=0)]
Fraction = Annotated[float, Field(ge=0.0, le=1.0)]
PathText = Annotated[str, Field(min_length=1, max_length=4096)]  # a local path, glob or fsspec URI


def Bounded(most: int) -> Any:  # noqa: N802 (reads as a type in a field's annotation)
    """A positive count, size or duration of at most ``most``: every one in the schema has a ceiling."""
    return Annotated[int, Field(gt=0, le=most)]


class ConfigError(BadInput):
    """A config that cannot be used; ``errors`` maps dotted field paths to reasons."""

    def __init__(self, errors: dict[str, str], source: str = "config") -> None:
        self.errors = errors
        lines = [f"invalid {source}:"] + [f"  {path}: {why}" for path, why in errors.items()]
        super().__init__("\n".join(lines))


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
