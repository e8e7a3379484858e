"""docs/configuration.md is what the pydantic models generate now, and it covers every field."""

from __future__ import annotations

from tools import config_reference
from tools.config_reference import OUT, reference


def test_the_committed_reference_is_generated_from_the_models() -> None:
    assert OUT.read_text() == reference(), "run: python -m tools.config_reference"


def test_every_field_of_every_section_is_listed() -> None:
    text = reference()
    for model in config_reference._models(config_reference.AppConfig):
        assert f"## {model.__name__}\n" in text
        body = text.split(f"## {model.__name__}\n", 1)[1].split("\n## ", 1)[0]
        for name in model.model_fields:
            assert f"| `{name}` |" in body, f"{model.__name__}.{name}"
