"""Stop strings over streamed text: a piece that might be the start of a stop string is held back
until the next piece says whether it is one."""

from __future__ import annotations

from typing import Sequence


class StopStrings:
    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self.held = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        """New text in; the part that is safe to show out (everything before a stop string, once found)."""
        if self.stopped:
            return ""
        self.held += text
        cut = min((i for i in (self.held.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            out, self.held, self.stopped = self.held[:cut], "", True
            return out
        keep = 0        # longest tail of held that is a proper prefix of some stop string
        for s in self.stops:
            for n in range(min(len(s) - 1, len(self.held)), 0, -1):
                if self.held.endswith(s[:n]):
                    keep = max(keep, n)
                    break
        out, self.held = self.held[:len(self.held) - keep], self.held[len(self.held) - keep:]
        return out

    def flush(self) -> str:
        out, self.held = ("" if self.stopped else self.held), ""
        return out
