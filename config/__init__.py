"""Configuration and the `brorl` command line.

Lives here: the pydantic schema of a job (`schema.py`), TOML presets (`*.toml`), the loader that
applies dotted command-line overrides (`loader.py`) and the CLI entry point (`cli.py`).
Must not import: vLLM, torch or any role's runtime at module import time — `brorl --help` and
`brorl config show` have to stay fast; roles are imported inside the sub-command that runs them.
"""

__all__ = ["BrorlConfig", "ConfigError", "load_config"]


def __getattr__(name: str):  # lazy, so that `import config.cli` pulls in no pydantic
    if name in ("ConfigError", "load_config"):
        from config import loader

        return getattr(loader, name)
    if name == "BrorlConfig":
        from config.schema import BrorlConfig

        return BrorlConfig
    raise AttributeError(name)
