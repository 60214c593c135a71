"""Final-answer extraction shared by the verifiers of free-text answers (science; math's hedging guard).

`boxed(text)` lists every \\boxed{...} / \\fbox{...} content (nested braces kept whole). A completion that
boxes several *different* answers is hedging: the verifiers that use `hedged` score it wrong, whichever
box holds the reference.
"""

from __future__ import annotations

import re

_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")


def boxed(text: str) -> list[str]:
    """Contents of every \\boxed{...} in order (brace-balanced); an unclosed one is ignored."""
    out = []
    for m in _BOX.finditer(text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            out.append(text[m.end():i - 1].strip())
    return out


def normalize(s: str) -> str:
    """Lower case, LaTeX text wrappers and `$` dropped, whitespace and trailing punctuation trimmed."""
    s = re.sub(r"\\(?:text|mathrm|textbf|mathbf)\s*\{([^{}]*)\}", r"\1", s)
    s = s.replace("$", "").replace("\\,", " ").replace("~", " ")
    return re.sub(r"\s+", " ", s).strip().strip(".;:,").strip().lower()


def hedged(text: str) -> bool:
    """Several boxed answers that differ (after `normalize`)."""
    return len({normalize(b) for b in boxed(text)}) > 1
