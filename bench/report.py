"""Plain-text tables, PASS/FAIL goal lines and INFO lines for the benchmark scripts."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["Goal", "Info", "fmt", "ratio", "render_goals", "render_table", "write_json"]


def fmt(value: object, digits: int = 1) -> str:
    """Numbers with thousands separators; None as '-'."""
    if value is None:
        return "-"
    if isinstance(value, float):
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def ratio(ours: float | None, theirs: float | None) -> str:
    if not ours or not theirs:
        return "-"
    return f"{ours / theirs:.2f}x"


def _is_numeric(cell: str) -> bool:
    text = cell.replace(",", "").replace(".", "").replace("x", "").replace("-", "")
    return text.isdigit()


def render_table(headers: list[str], rows: list[list[str]]) -> str:
    """Aligned columns: text left, numbers right; a dashed rule under the header."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        out = []
        for i, cell in enumerate(cells):
            out.append(cell.rjust(widths[i]) if i and _is_numeric(cell) else cell.ljust(widths[i]))
        return "  ".join(out).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])


@dataclass
class Goal:
    """One goal from the issue, evaluated on figures from the same run."""

    name: str
    passed: bool | None  # None: not measured (e.g. peers skipped)
    detail: str

    def line(self) -> str:
        state = {True: "PASS", False: "FAIL", None: "N/A "}[self.passed]
        return f"{state}  {self.name}: {self.detail}"


@dataclass
class Info:
    """A figure printed among the goal lines to help judge them; never a verdict."""

    name: str
    detail: str

    def line(self) -> str:
        return f"INFO  {self.name}: {self.detail}"


def render_goals(goals: Sequence[Goal | Info]) -> str:
    return "\n".join(g.line() for g in goals)


def write_json(path: str | Path, result: dict[str, Any], goals: Sequence[Goal | Info]) -> None:
    payload = {**result, "goals": [{**asdict(g), "info": isinstance(g, Info)} for g in goals]}
    Path(path).write_text(json.dumps(payload, indent=2, default=str) + "\n")


def run_comparison(a: Any, title: str, run_peer: Any, run_npstream: Any,
                   build_report: Any) -> int:
    """The shared main of broker.py and groups.py: peers alone first, then ours, one report.

    Peers missing from ../shared stop the run (exit 2); peers not installed are
    noted and our rows are still printed.
    """
    from bench_common import machine_info
    from peer_runner import PeersMissing, PeersNotInstalled, check_peers

    peers: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    if not a.skip_peers:
        try:
            check_peers(a.peers)
        except PeersMissing as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except PeersNotInstalled as exc:
            notes.append(f"peers skipped: {exc}")
            print(f"# {notes[-1]}", file=sys.stderr)
        else:
            for name in a.peers:
                peers[name] = run_peer(name, a)
    ours = run_npstream(a)
    text, goals = build_report(a, ours, peers)
    meta = machine_info()
    print(f"{title}, {meta['date_utc']}, {meta['cores']} cores, Python {meta['python']}")
    print(text)
    for note in notes:
        print(note)
    print()
    print(render_goals(goals))
    if a.json:
        write_json(a.json, {"meta": meta, "args": dict(vars(a)), "npstream": ours,
                            "peers": peers}, goals)
    return 0
