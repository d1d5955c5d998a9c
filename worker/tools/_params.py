"""Base class for tool params: strict, frozen, no unknown keys."""

from pydantic import BaseModel, ConfigDict


class Params(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)
