"""Values quoted into Markdown, escaped: the one helper for every page Taxiway writes that a person
reads rendered (the evaluation report, the approval request, a run's note). A value may come from a
trigger or the data (a prompt, a conf key, a file name): quoted through these it reads as itself and
makes no link, image, HTML or formatting."""

from __future__ import annotations

import re

# what starts Markdown markup inline (emphasis, code, links, images, HTML, entities, GFM strikethrough,
# table cells) and what starts a GFM bare link (``://``, ``www.``, an address's ``@``)
_MARKUP = re.compile(r"_+|[\\`*\[\]<>&!~|@]|:(?=//)|(?<=www)\.", re.IGNORECASE)


def text(value: object) -> str:
    """``value`` as literal Markdown text: a conf key or file name quoted in a note (``[x](javascript:…)``,
    ``<img …>``, a backtick) reads as itself and makes no link, image, HTML or formatting. ``_`` inside
    a word (``train_steps``) is left as it is: it cannot start emphasis there."""
    raw = str(value)

    def escaped(m: re.Match[str]) -> str:
        inside_word = 0 < m.start() and m.end() < len(raw) and raw[m.start() - 1].isalnum() and raw[m.end()].isalnum()
        return m.group() if m.group()[0] == "_" and inside_word else "".join(f"\\{c}" for c in m.group())

    return _MARKUP.sub(escaped, raw)


def code(value: object) -> str:
    """``value`` as a Markdown code span, literal whatever it holds: fenced by one backtick more than
    its longest run of them, padded when it starts or ends with one."""
    raw = str(value).replace("\n", " ")
    fence = "`" * (max((len(run) for run in re.findall(r"`+", raw)), default=0) + 1)
    pad = " " if raw[:1] in ("`", " ") or raw[-1:] in ("`", " ") else ""
    return f"{fence}{pad}{raw}{pad}{fence}"


def fenced(value: object) -> str:
    """``value`` as a fenced code block, literal whatever it holds: fenced by more backticks than its
    longest run of them (at least three)."""
    raw = str(value)
    fence = "`" * max(3, max((len(run) for run in re.findall(r"`+", raw)), default=0) + 1)
    return f"{fence}\n{raw}\n{fence}"
