"""The base of every configuration section: unknown keys fail (a typo names its path), each field's docstring
is its description (`brorl config explain`), and assignments are validated."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True)
