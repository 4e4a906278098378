"""The `npstream groups ...` commands and `npstream consume --group G` (work in progress)."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["consume_with_group", "register"]


def register(subparsers: Any) -> None:
    """Add `groups list|describe|seek|delete` to the CLI's subparsers."""
    groups = subparsers.add_parser("groups", help="consumer groups: list, describe, seek, delete")
    groups.add_subparsers(dest="groups_command", required=True)


def consume_with_group(client: Any, args: argparse.Namespace) -> int:
    """Run `npstream consume STREAM --group G`; returns the exit code."""
    raise NotImplementedError("consume --group is not implemented yet")
