"""What every config section shares: a frozen pydantic model that refuses unknown fields, the
error that names every bad field by its dotted path, and the constrained number types."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from pipelines.errors import BadInput

PositiveInt = Annotated[int, Field(gt=0)]
Fraction = Annotated[float, Field(ge=0.0, le=1.0)]


class ConfigError(BadInput):
    """A config that cannot be used; ``errors`` maps dotted field paths to reasons."""

    def __init__(self, errors: dict[str, str], source: str = "config") -> None:
        self.errors = errors
        lines = [f"invalid {source}:"] + [f"  {path}: {why}" for path, why in errors.items()]
        super().__init__("\n".join(lines))


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
