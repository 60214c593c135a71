"""Verifiers by name and version, loadable by dotted path, swappable at run time.

A verifier module defines `NAME`, `VERSION`, `score(completion, reference) -> VerifierResult` and
`SELF_TEST`, a list of (completion, reference, expected correct) that must hold before the verifier is
accepted, and may declare `REWARD_RANGE` (lowest, highest reward it gives; default (0.0, 1.0): the learner
rejects groups with rewards outside it) and `check_reference(reference) -> str` ("" or why a dataset's
reference is unusable: the row is refused when the data is loaded, `taskdata.sources`) and
`describe(reference) -> str` (what it reads from a reference, for `brorl data preview`). `module.path:attr` names a
`Verifier` object instead. Rollouts (`actors.scoring`) and evaluation (`verifiers.batch`) score with the
verifier at a registered path, each in worker processes.

Hot swap: `Registry.swap(name, path)` imports the new verifier, runs its self-test and only then
replaces (or adds) `name`; any failure raises `VerifierLoadError` with the reason and leaves the
previous verifier in force. Actors and the learner do the import and self-test in a separate process
(`verifiers.check`) and `adopt` the result, so no verifier code runs in their own process.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field
from typing import Callable

from verifiers.base import VerifierResult

BUILTINS = {
    "synthetic": "verifiers.synthetic",
    "math": "verifiers.math",
    "code": "verifiers.code",
    "reasoning_gym": "verifiers.reasoning_gym",
    "science": "verifiers.science",
    "ifeval": "verifiers.ifeval",
    "throughput": "verifiers.throughput",
}


class VerifierLoadError(Exception):
    """A verifier could not be imported, is malformed, or failed its self-test."""


@dataclass(frozen=True)
class Verifier:
    name: str
    version: str
    score: Callable[[str, str], VerifierResult]
    self_test: list[tuple[str, str, bool]] = field(default_factory=list)
    path: str = ""
    reward_range: tuple[float, float] = (0.0, 1.0)
    check_reference: Callable[[str], str] | None = None
    """The verifier's rule for a dataset's references ("" or why a reference is unusable), checked when the
    data is loaded; None: every reference is accepted (a bad one shows as an error when scored)."""
    describe: Callable[[str], str] | None = None
    """What the verifier reads from a reference, in words (`brorl data preview`); None: the text itself."""


@dataclass(frozen=True)
class VerifierInfo:
    """What a verifier declared when it passed its self-test (in another process: `verifiers.check`)."""

    name: str
    version: str
    reward_range: tuple[float, float]
    path: str


def load(path: str) -> Verifier:
    """Import a verifier from `package.module` or `package.module:attr`."""
    mod_name, _, attr = path.partition(":")
    try:
        mod = importlib.import_module(mod_name)
        if attr:
            obj = getattr(mod, attr)
            if not isinstance(obj, Verifier):
                raise VerifierLoadError(f"{path}: {attr} is a {type(obj).__name__}, not a Verifier")
            return obj
        missing = [a for a in ("NAME", "VERSION", "score") if not hasattr(mod, a)]
        if missing:
            raise VerifierLoadError(f"{path}: module lacks {', '.join(missing)}")
        lo, hi = getattr(mod, "REWARD_RANGE", (0.0, 1.0))
        if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
            raise VerifierLoadError(f"{path}: REWARD_RANGE {(lo, hi)} is not a finite (low, high) pair")
        return Verifier(mod.NAME, str(mod.VERSION), mod.score, list(getattr(mod, "SELF_TEST", [])), path,
                        (float(lo), float(hi)), getattr(mod, "check_reference", None), getattr(mod, "describe", None))
    except VerifierLoadError:
        raise
    except Exception as e:  # ImportError, SyntaxError, AttributeError, anything the import ran
        raise VerifierLoadError(f"{path}: cannot be imported: {type(e).__name__}: {e}") from e


def run_self_test(v: Verifier) -> None:
    if not v.self_test:
        raise VerifierLoadError(f"{v.path or v.name}: has no SELF_TEST cases; a verifier must prove itself")
    for i, (completion, reference, expected) in enumerate(v.self_test):
        try:
            res = v.score(completion, reference)
        except Exception as e:
            raise VerifierLoadError(f"{v.path or v.name}: self-test {i} raised {type(e).__name__}: {e}") from e
        if not isinstance(res, VerifierResult):
            raise VerifierLoadError(f"{v.path or v.name}: self-test {i} returned {type(res).__name__}, not VerifierResult")
        if res.correct != expected:
            raise VerifierLoadError(
                f"{v.path or v.name}: self-test {i} failed: expected correct={expected}, got {res.correct} ({res.reason})"
            )


class Registry:
    def __init__(self, builtins: dict[str, str] | None = None):
        self._by_name: dict[str, Verifier] = {}
        self._adopted: dict[str, VerifierInfo] = {}  # checked in another process, never imported here
        self._paths = dict(BUILTINS if builtins is None else builtins)

    def adopt(self, name: str, info: VerifierInfo) -> None:
        """Make `info.path` (self-tested elsewhere: `verifiers.check`) the verifier for `name`."""
        self._paths[name] = info.path
        self._adopted[name] = info
        self._by_name.pop(name, None)

    def info(self, name: str) -> VerifierInfo:
        """Name, version and reward range of the verifier for `name` (a built-in is imported to learn it)."""
        if name in self._adopted:
            return self._adopted[name]
        v = self.get(name)
        return VerifierInfo(v.name, v.version, v.reward_range, self._paths.get(name, v.path))

    def get(self, name: str) -> Verifier:
        """The verifier object, imported into this process (built-ins)."""
        if name not in self._by_name:
            if name not in self._paths:
                raise KeyError(f"no verifier named {name!r} (known: {', '.join(sorted(self.names()))})")
            self._by_name[name] = load(self._paths[name])
        return self._by_name[name]

    def names(self) -> set[str]:
        return set(self._paths) | set(self._by_name) | set(self._adopted)

    def path(self, name: str) -> str | None:
        """Dotted path of the verifier in force for `name` (None if there is none)."""
        return self._paths.get(name)

    def in_force(self) -> dict[str, str]:
        """Name -> "path@version" of every verifier loaded so far (what an actor acknowledges)."""
        out = {n: f"{self._paths.get(n, v.path)}@{v.version}" for n, v in self._by_name.items()}
        return out | {n: f"{i.path}@{i.version}" for n, i in self._adopted.items()}

    def swap(self, name: str, path: str) -> Verifier:
        """Load `path`, self-test it, then make it the verifier for `name`. Raises VerifierLoadError and
        changes nothing if any step fails."""
        v = load(path)
        run_self_test(v)
        self._by_name[name] = v
        self._paths[name] = path
        self._adopted.pop(name, None)
        return v

    def try_swap(self, name: str, path: str) -> str:
        """`swap`, reporting instead of raising: "" on success, else why it was rejected (the previous
        verifier stays)."""
        try:
            self.swap(name, path)
        except VerifierLoadError as e:
            return f"swap {name} -> {path} rejected: {e}"
        return ""

    def score(self, name: str, completion: str, reference: str) -> tuple[VerifierResult, str]:
        """Score one completion; a verifier that raises yields reward 0 with the error as reason.
        Returns the result and the version that produced it."""
        v = self.get(name)
        try:
            return v.score(completion, reference), v.version
        except Exception as e:
            return VerifierResult(0.0, False, f"error: {type(e).__name__}: {e}"), v.version
