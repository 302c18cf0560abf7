"""Keeping a long conversation inside the context: compact the middle instead of failing.

Kept verbatim: the system prompt, the first exchange (it usually states the task) and as many recent
turns as fit. The turns in between become one short note of their salient lines — the ones holding
names, paths, numbers or code identifiers — so facts the user gave early are not silently lost.
"""

from __future__ import annotations

import re
from typing import Callable

# A line is salient when it names something concrete.
SALIENT = re.compile(
    r"(?:[\w.-]+/[\w./-]+)"              # paths and URLs
    r"|(?:\b\d[\d.,:%]*\b)"              # numbers, times, versions
    r"|(?:\b[A-Z][a-z]+(?:\s[A-Z][a-z]+)+)"  # multi-word names
    r"|(?:\b\w+_\w+\b|\b[a-z]+[A-Z]\w*\b|\b\w+\(\))"  # snake_case, camelCase, calls
    r"|(?:`[^`]+`)"                       # inline code
)
MAX_NOTE_LINES = 40
NOTE_SHARE = 0.25        # of the budget kept for the compacted middle's key lines
MAX_LINE_CHARS = 200


def salient_lines(messages: list[dict]) -> list[str]:
    lines = []
    for m in messages:
        for line in str(m.get("content", "")).splitlines():
            line = line.strip()
            if line and SALIENT.search(line):
                lines.append(f"{m.get('role', 'user')}: {line[:MAX_LINE_CHARS]}")
    return lines[-MAX_NOTE_LINES:]


def compact(messages: list[dict], count_tokens: Callable[[list[dict]], int], budget: int) -> tuple[list[dict], bool]:
    """`messages` if they fit `budget` tokens, else a compacted copy that does (as far as possible);
    the flag says whether anything was compacted. `count_tokens` renders and counts a message list
    (called O(turns + log lines) times)."""
    if count_tokens(messages) <= budget:
        return messages, False
    head = [m for m in messages[:1] if m.get("role") == "system"]
    rest = messages[len(head):]
    first = rest[:2] if len(rest) > 3 else []        # the first exchange, when there is more after it
    # 1. the most recent turns that fit beside the head, the first exchange and an empty note, leaving
    #    NOTE_SHARE of the budget for the note's lines; the tail starts on a user turn so roles keep
    #    alternating after the note.
    for target in (int(budget * (1 - NOTE_SHARE)), budget):
        for start in range(len(first), len(rest)):
            if rest[start].get("role") != "user" and start != len(rest) - 1:
                continue
            middle, recent = rest[len(first):start], rest[start:]
            if count_tokens(head + first + _note(middle, []) + recent) <= target:
                break
        else:
            continue
        break
    else:
        return head + rest[-1:], True                # even the last message alone barely fits
    # 2. as many of the middle's salient lines (most recent first) as still fit.
    lines = salient_lines(middle)
    while lines and count_tokens(head + first + _note(middle, lines) + recent) > budget:
        lines = lines[len(lines) // 2 + 1:] if len(lines) > 1 else []
    return head + first + _note(middle, lines) + recent, True


def _note(middle: list[dict], lines: list[str]) -> list[dict]:
    if not middle:
        return []
    body = "\n".join(lines) if lines else "(details omitted to fit the context)"
    return [{"role": "user", "content": f"[Earlier conversation compacted: {len(middle)} messages. Key lines:]\n{body}"},
            {"role": "assistant", "content": "Noted."}]
