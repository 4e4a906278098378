"""A tuning constant lives once: in its package's tuning module, with what its value trades.

Walks every broker module (ast) for module-level names bound to a number. Outside
the tuning modules such a name must be a format or protocol constant (a byte
layout, a file-format version, a sentinel, a system call's parameter), listed
below with the reason it belongs beside its format.
"""

from __future__ import annotations

import ast
from pathlib import Path

from harness import REPO_ROOT

BROKER = REPO_ROOT / "broker"

# (module relative to broker/, name) -> why it stays beside its format.
FORMAT_CONSTANTS = {
    ("cluster/settings.py", "MIN_MEMBER_LEASE_MS"): "the lower bound of a broker.toml key (config)",
    ("faults.py", "FAULT_EXIT_CODE"): "the exit code tests wait for, a protocol with them",
    ("groups/handover.py", "_VERSION"): "version of the handed-over group records",
    ("groups/key_order.py", "_END"): "sentinel that sorts after every run end",
    ("server/config.py", "MIB"): "a unit of the config keys' defaults",
    ("server/heap.py", "_M_TRIM_THRESHOLD"): "glibc mallopt parameter number",
    ("server/heap.py", "_M_MMAP_THRESHOLD"): "glibc mallopt parameter number",
    ("server/heap.py", "_M_ARENA_MAX"): "glibc mallopt parameter number",
    ("server/heap.py", "_MMAP_THRESHOLD_MAX"): "glibc's largest mmap threshold on 64-bit",
    ("sink/handover.py", "_VERSION"): "version of the handed-over sink records",
    ("sink/staging_format.py", "FORMAT"): "version of the staged file format",
    ("sink/staging_format.py", "_ID_PREFIX_BYTES"): "length of the generated id prefix",
    ("kafka/handlers.py", "NODE_ID"): "the one broker's node id in Kafka's Metadata",
    ("kafka/protocol.py", "API_VERSIONS_KEY"): "Kafka's API key of ApiVersions",
    ("kafka/records.py", "_CRC_START"): "record batch v2: where the CRC-32C's range starts",
    ("kafka/records.py", "_LENGTH_BASE"): "record batch v2: bytes before the length counts",
    ("kafka/records.py", "_TRANSACTIONAL"): "record batch v2: the transactional attribute bit",
    ("kafka/records.py", "_CONTROL"): "record batch v2: the control-batch attribute bit",
    ("storage/batch_builder.py", "ID_PREFIX_CHARS"): "length of a generated id's prefix",
    ("storage/direct_write.py", "ALIGNMENT"): "O_DIRECT's block alignment",
    ("storage/files.py", "_BASE_DIGITS"): "digits of a segment file's base offset in its name",
    ("storage/retention.py", "NEVER"): "sentinel: a time that never comes",
    ("storage/segment_list.py", "_MAX_RELATIVE_OFFSET"): "relative offsets are uint32",
    ("storage/settings.py", "MAX_SEGMENT_BYTES"): "index entries store positions as uint32",
    ("storage/sparse_index.py", "_VERSION"): "version of the sparse index file",
    ("storage/stream_files.py", "_EXTENT_RECORD_BYTES"): "log-extent record, one sector",
    ("streams/consistency.py", "_WAL_HEADER"): "SQLite WAL file header size",
    ("streams/consistency.py", "_WAL_FRAME_HEADER"): "SQLite WAL frame header size",
    ("streams/handover.py", "_VERSION"): "version of the handed-over stream records",
}


def _is_tuning_module(relative: str) -> bool:
    return relative.endswith("/tuning.py")


def _numeric(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
    if isinstance(node, ast.UnaryOp):
        return _numeric(node.operand)
    if isinstance(node, ast.BinOp):
        return _numeric(node.left) and _numeric(node.right)
    return False


def _numeric_constants(path: Path) -> list[str]:
    names = []
    for statement in ast.parse(path.read_text()).body:
        if isinstance(statement, ast.Assign):
            targets, value = statement.targets, statement.value
        elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
            targets, value = [statement.target], statement.value
        else:
            continue
        if _numeric(value):
            names += [t.id for t in targets if isinstance(t, ast.Name)]
    return names


def _broker_modules() -> list[tuple[str, Path]]:
    return [(p.relative_to(BROKER).as_posix(), p) for p in sorted(BROKER.rglob("*.py"))
            if not p.name.endswith("_pb2.py")]


def test_numeric_module_constants_outside_tuning_modules_are_listed_formats():
    found = {(relative, name) for relative, path in _broker_modules()
             if not _is_tuning_module(relative)
             for name in _numeric_constants(path)}
    stray = sorted(found - set(FORMAT_CONSTANTS))
    assert not stray, ("numeric module constants outside a tuning module: move them to the "
                       "package's tuning.py (with what the value trades), or list a format "
                       f"constant in FORMAT_CONSTANTS with its reason: {stray}")
    stale = sorted(set(FORMAT_CONSTANTS) - found)
    assert not stale, f"FORMAT_CONSTANTS lists names that are gone: {stale}"


def test_each_tuning_constant_has_a_comment_saying_what_it_trades():
    for relative, path in _broker_modules():
        if not _is_tuning_module(relative):
            continue
        lines = path.read_text().splitlines()
        for statement in ast.parse(path.read_text()).body:
            if not (isinstance(statement, (ast.Assign, ast.AnnAssign))
                    and statement.value is not None and _numeric(statement.value)):
                continue
            row = statement.lineno - 1
            while row > 0 and "#" not in lines[row] and " = " in lines[row - 1]:
                row -= 1  # constants declared together share the comment above them
            assert "#" in lines[row] or lines[row - 1].lstrip().startswith("#"), \
                f"broker/{relative}:{statement.lineno} has no comment saying what it trades"
