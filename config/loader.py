"""Load a `BrorlConfig` from a TOML preset plus dotted command-line overrides.

    cfg = load_config("config/tiny-cpu.toml", ["--learner.eps_high", "0.28"])

A preset name without a path (`tiny-cpu`) resolves to the file shipped in this package. Override
values are parsed as TOML literals (`0.28`, `true`, `[1, 2]`, `"text"`); anything that is not a TOML
literal is taken as a plain string. Every failure raises `ConfigError` whose message names the
dotted field (`learner.eps_high: ...`).
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any, Iterable

from pydantic import ValidationError

from config.schema import BrorlConfig

PRESET_DIR = Path(__file__).resolve().parent
DEFAULT_PRESET = "tiny-cpu"


class ConfigError(ValueError):
    """A configuration file, override or value is invalid; the message names the field."""


def preset_paths() -> list[Path]:
    """Every TOML preset shipped in `config/`."""
    return sorted(PRESET_DIR.glob("*.toml"))


def resolve_preset(name_or_path: str | Path | None) -> Path:
    if name_or_path is None:
        name_or_path = DEFAULT_PRESET
    p = Path(name_or_path)
    if p.exists():
        return p
    shipped = PRESET_DIR / (p.name if p.suffix == ".toml" else f"{p.name}.toml")
    if shipped.exists():
        return shipped
    names = ", ".join(q.stem for q in preset_paths())
    raise ConfigError(f"config file {str(name_or_path)!r} not found (shipped presets: {names})")


def parse_overrides(args: Iterable[str]) -> dict[str, Any]:
    """`["--a.b", "1", "--c.d=x"]` -> `{"a.b": 1, "c.d": "x"}`."""
    out: dict[str, Any] = {}
    items = list(args)
    i = 0
    while i < len(items):
        tok = items[i]
        if not tok.startswith("--") or len(tok) <= 2:
            raise ConfigError(f"override {tok!r} is not of the form --section.key VALUE")
        key = tok[2:]
        if "=" in key:
            key, raw = key.split("=", 1)
            i += 1
        else:
            if i + 1 >= len(items):
                raise ConfigError(f"override --{key} has no value")
            raw = items[i + 1]
            i += 2
        if "." not in key:
            raise ConfigError(f"override --{key} must name a dotted field such as --learner.eps_high")
        out[key] = _parse_value(raw)
    return out


def _parse_value(raw: str) -> Any:
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        pass
    if raw.lstrip()[:1] in "[{":  # JSON too: `--data.train '[{"path": "a.parquet", "weight": 2}]'`
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            pass
    return raw


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    for dotted, value in overrides.items():
        node = data
        parts = dotted.split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"{dotted}: {part!r} is a value, not a section")
            node = child
        node[parts[-1]] = value
    return data


def load_config(
    path: str | Path | None = None, overrides: Iterable[str] | dict[str, Any] = ()
) -> BrorlConfig:
    file = resolve_preset(path)
    try:
        data = tomllib.loads(file.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{file}: not valid TOML: {e}") from e
    ov = overrides if isinstance(overrides, dict) else parse_overrides(overrides)
    apply_overrides(data, ov)
    return validate(data, source=str(file), overridden=set(ov))


def validate(data: dict[str, Any], source: str = "<config>", overridden: set[str] = frozenset()) -> BrorlConfig:
    """`overridden`: the dotted keys set on the command line (an error names where its key came from)."""
    try:
        return BrorlConfig.model_validate(data)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            loc = ".".join(str(x) for x in err["loc"])
            msg = err["msg"]
            if err["type"] == "extra_forbidden":
                where = f"--{loc} on the command line" if loc in overridden else f"in {source}"
                msg = f"unknown key ({where}){_did_you_mean(err['loc'])}"
            elif msg.startswith("Value error, "):
                msg = msg[len("Value error, "):]
            lines.append(f"{loc}: {msg}" if loc else msg)
        raise ConfigError(f"invalid configuration ({source}):\n  " + "\n  ".join(lines)) from None


def _did_you_mean(loc: tuple) -> str:
    """"; did you mean learner.steps?" for a misspelt key or section, from the fields where it was given."""
    import difflib

    model, parts = BrorlConfig, [str(x) for x in loc]
    for part in parts[:-1]:
        f = model.model_fields.get(part)
        model = getattr(f, "annotation", None) if f else None
        if not (isinstance(model, type) and hasattr(model, "model_fields")):
            return ""
    names = list(model.model_fields)
    other = [f"{sec}.{parts[-1]}" for sec, f in BrorlConfig.model_fields.items()
             if len(parts) == 2 and parts[-1] in getattr(f.annotation, "model_fields", {})]
    if other:  # the same key in another section (`learner.n_samples` for `job.n_samples`)
        return f"; did you mean {other[0]}?"
    close = difflib.get_close_matches(parts[-1], names, n=1, cutoff=0.6)
    if close:
        return f"; did you mean {'.'.join(parts[:-1] + close)}?"
    if model is BrorlConfig:
        return f"; sections are {', '.join(names)}"
    return f"; `brorl config explain` lists the fields of {'.'.join(parts[:-1])}"


def to_toml(cfg: BrorlConfig) -> str:
    """Render a resolved config as TOML (sections in schema order)."""
    out = []
    for section, model in cfg:
        out.append(f"[{section}]")
        for key, value in model:
            out.append(f"{key} = {_toml_value(value)}")
        out.append("")
    return "\n".join(out)


def _toml_value(v: Any) -> str:
    if hasattr(v, "model_dump"):  # a table inside a section (a data source)
        v = v.model_dump()
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):  # a TOML basic string: JSON's escapes are TOML's (a template's newlines included)
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_toml_value(str(k))} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"cannot render {type(v).__name__} as TOML")
