"""The tokens file: format checks, glob matching, lookups, and the live table's reloads."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest

from npstream.broker.auth.access import AccessControl
from npstream.broker.auth.tokens import (
    AUTH_TOKEN_NAME,
    CLUSTER_TOKEN_NAME,
    Right,
    TokensFileError,
    TokenTable,
    bearer_token,
    read_tokens_file,
)

FILE = """
[[tokens]]
name = "etl"
token = "etl-secret-1"
read = ["orders", "orders-*"]
write = ["orders-out"]

[[tokens]]
token = "ops-secret-2"
admin = ["*"]
"""


def tokens_file(tmp_path: Path, text: str = FILE, name: str = "tokens.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_entries_rights_and_names(tmp_path):
    etl, ops = read_tokens_file(tokens_file(tmp_path))
    assert (etl.name, ops.name) == ("etl", "tokens[1]")  # unnamed: its position
    assert etl.globs == {Right.READ: ("orders", "orders-*"), Right.WRITE: ("orders-out",),
                         Right.ADMIN: ()}
    assert ops.globs[Right.READ] == ()  # a missing key grants nothing
    assert "secret" not in repr(etl) + repr(ops)


@pytest.mark.parametrize(("glob", "stream", "allowed"), [
    ("orders", "orders", True),
    ("orders", "orders-eu", False),          # a plain name is exact
    ("orders*", "orders", True),
    ("orders*", "orders-eu", True),
    ("orders-*", "orders", False),
    ("orders-?", "orders-1", True),
    ("orders-?", "orders-12", False),
    ("orders-[ab]", "orders-b", True),
    ("orders-[ab]", "orders-c", False),
    ("Orders*", "orders", False),            # case-sensitive, like ListStreams' pattern
    ("*", "anything.at-all_1", True),
    ("*.dlq", "orders.dlq", True),
])
def test_glob_matching(tmp_path, glob, stream, allowed):
    path = tokens_file(tmp_path, f'[[tokens]]\ntoken = "t"\nread = ["{glob}"]\n')
    (grant,) = read_tokens_file(path)
    assert grant.allows(stream, Right.READ) is allowed
    assert grant.allows(stream, Right.READ) is allowed  # cached decision, same answer
    assert not grant.allows(stream, Right.WRITE)        # rights are independent


@pytest.mark.parametrize(("text", "message"), [
    ("[[tokens]\n", "is not valid TOML"),
    ('[[tokens]]\ntoken = "a"\nreed = ["x"]\n', "unknown key(s) ['reed']"),
    ('[[tokens]]\nread = ["x"]\n', "'token' must be a non-empty string"),
    ('[[tokens]]\ntoken = ""\n', "'token' must be a non-empty string"),
    ('[[tokens]]\ntoken = "a b"\n', "must not contain spaces"),
    ('[[tokens]]\ntoken = "a"\nread = "orders"\n', "'read' must be a list"),
    ('[[tokens]]\ntoken = "a"\nwrite = [""]\n', "is not a glob"),
    ('[[tokens]]\ntoken = "a"\nadmin = [3]\n', "is not a glob"),
    ('[[tokens]]\ntoken = "a"\nname = ""\n', "'name' must be a non-empty string"),
    ('token = "a"\n', "unknown top-level key(s) ['token']"),
    ('[tokens]\ntoken = "a"\n', "must be [[tokens]] tables"),
])
def test_bad_files_are_refused_naming_the_problem(tmp_path, text, message):
    with pytest.raises(TokensFileError) as error:
        read_tokens_file(tokens_file(tmp_path, text))
    assert message in str(error.value)
    assert str(tmp_path) in str(error.value)


def test_a_refusal_never_shows_a_token(tmp_path):
    text = ('[[tokens]]\nname = "one"\ntoken = "topsecret-a"\n'
            '[[tokens]]\nname = "two"\ntoken = "topsecret-a"\n')
    with pytest.raises(TokensFileError) as error:
        TokenTable.build("", tokens_file(tmp_path, text))
    assert "'two' has the same token as 'one'" in str(error.value)
    assert "topsecret" not in str(error.value)
    first_only = text.split('[[tokens]]\nname = "two"')[0]
    with pytest.raises(TokensFileError, match=f"same token as '{AUTH_TOKEN_NAME}'"):
        TokenTable.build("topsecret-a", tokens_file(tmp_path, first_only))


def test_lookup_by_bearer_header_and_the_auth_token_shortcut(tmp_path):
    table = TokenTable.build("root-token", tokens_file(tmp_path))
    assert len(table) == 3
    root = table.lookup(bearer_token("Bearer root-token"))
    assert root is not None and root.name == AUTH_TOKEN_NAME
    assert all(root.allows("any.stream", right) for right in Right)
    assert table.lookup(bearer_token(b"bearer etl-secret-1")).name == "etl"
    for header in (None, "", "Bearer", "Bearer ", "etl-secret-1", "Basic etl-secret-1",
                   "Bearer etl-secret-", "Bearer etl-secret-1x", "Bearer ETL-SECRET-1"):
        assert table.lookup(bearer_token(header)) is None, header


def test_the_cluster_token_makes_internal_calls_only_and_survives_reloads(tmp_path):
    path = tokens_file(tmp_path)
    table = TokenTable.build("", path, "members-token")
    member = table.lookup(bearer_token("Bearer members-token"))
    assert member is not None and member.name == CLUSTER_TOKEN_NAME and member.internal
    assert not any(member.allows("any.stream", right) for right in Right)
    assert not table.lookup(bearer_token("Bearer etl-secret-1")).internal
    with pytest.raises(TokensFileError, match="same token"):
        TokenTable.build("", path, "etl-secret-1")
    access = AccessControl("", path, "members-token")
    assert access.authenticated("Bearer members-token") and "cluster_token" in access.describe()
    assert access.reload("test") and access.authenticated("Bearer members-token")
    # Without auth there is nothing to authenticate to: the token is not even known.
    assert not AccessControl("", None, "members-token").authenticated("Bearer members-token")


def test_access_control_reload_swaps_the_table_and_a_bad_file_keeps_the_old(tmp_path, caplog):
    path = tokens_file(tmp_path)
    access = AccessControl("", path)
    assert access.enabled and access.authenticated("Bearer etl-secret-1")
    replacement = tokens_file(tmp_path, '[[tokens]]\nname = "new"\ntoken = "new-secret"\n',
                              "next.toml")
    os.replace(replacement, path)
    with caplog.at_level(logging.INFO, logger="npstream.broker.auth.access"):
        assert access.reload("test")
        assert access.authenticated("Bearer new-secret")
        assert not access.authenticated("Bearer etl-secret-1")
        path.write_text("[[tokens]\n")
        assert not access.reload("test")
    assert access.authenticated("Bearer new-secret")  # the previous table stays
    assert "not reloaded, the previous 1 token(s) stay in force" in caplog.text
    assert "reloaded: 1 token(s): new" in caplog.text
    assert "secret" not in caplog.text.replace("new-secret", "")  # names only
    assert "new-secret" not in caplog.text


def test_watcher_reloads_when_the_file_changes(tmp_path):
    path = tokens_file(tmp_path)
    access = AccessControl("", path).start()
    try:
        path.write_text('[[tokens]]\ntoken = "changed-token"\nread = ["*"]\n')
        deadline = time.monotonic() + 10
        while not access.authenticated("Bearer changed-token"):
            assert time.monotonic() < deadline, "the tokens file change was not picked up"
            time.sleep(0.05)
    finally:
        access.close()


def test_without_auth_everything_is_allowed_and_nothing_watched():
    access = AccessControl().start()
    assert not access.enabled and access.describe() == "off"
    assert access.grant_of(None) is None  # type: ignore[arg-type]
    access.require(None, "any", Right.ADMIN)  # type: ignore[arg-type]
    access.close()
