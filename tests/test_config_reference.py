"""docs/config.md is generated from the config dataclasses and must be current."""

from pathlib import Path

from trace_jax.config_reference import field_comments, reference

DOC = Path(__file__).parent.parent / "docs" / "config.md"


def test_config_reference_is_current():
    assert DOC.read_text() == reference(), "docs/config.md is stale: run `trace-jax config-reference`"


def test_every_key_is_documented():
    undocumented = [line for line in reference().splitlines() if line.startswith("| `") and line.endswith("|  |")]
    assert not undocumented, f"give these config fields a `# comment`: {undocumented[:5]}"


def test_comments_are_read_beside_or_above_a_field_and_continued_below_it():
    class Example:
        plain: int = 1  # beside
        # above
        nested: tuple[int, ...] = (1, 2)
        bare: int = 3
        required: str  # no default
        long: int = 4  # beside,
        # continued
        # twice
        next: int = 5  # its own

    assert field_comments(Example) == {"plain": "beside", "nested": "above", "required": "no default",
                                       "long": "beside, continued twice", "next": "its own"}
