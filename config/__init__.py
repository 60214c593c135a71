"""Configuration of a job: the pydantic schema (`schema.py`), TOML presets (`*.toml`) and the loader that
applies dotted command-line overrides (`loader.py`).

A leaf: imports nothing of brorl (pydantic and the standard library only), so every role can import it
and it can never pull a role in. The `brorl` command line lives in `cli/`.
"""
