"""Command-line parsing of `npstream`: usage errors are one line with exit code 2.

These call npstream.cli.main.main in-process (no broker needed: every case fails
before a connection is made, or against a closed port). End-to-end runs of
the real script against a broker are in test_cli.py.
"""

from __future__ import annotations

import pytest

from npstream.cli.main import build_parser, main


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["streams", "create", "bad/name"], "argument name: invalid stream name 'bad/name'"),
        (["streams", "create", "s", "--max-age", "7x"],
         "argument --max-age: invalid duration '7x'"),
        (["streams", "create", "s", "--max-bytes", "1ZB"],
         "argument --max-bytes: invalid size '1ZB'"),
        (["streams", "truncate", "s"], "one of the arguments --before --all is required"),
        (["streams", "truncate", "s", "--before", "-3"], "argument --before: invalid offset '-3'"),
        (["streams", "list", "--prefix", "a", "--pattern", "b*"], "not allowed with argument"),
        (["consume", "s", "--max", "x"], "argument --max: invalid count 'x'"),
        (["consume", "s", "--group", ".hidden"], "invalid group name '.hidden'"),
        (["produce", "s", "--batch-size", "0"], "invalid count '0'"),
        (["frobnicate"], "argument COMMAND: invalid choice: 'frobnicate'"),
        ([], "the following arguments are required: COMMAND"),
    ],
)
def test_main_bad_command_line_prints_one_line_and_exits_2(capsys, argv, message):
    code, out, err = _run(capsys, *argv)
    assert code == 2
    assert out == ""
    assert err.startswith("npstream: error: ")
    assert message in err
    assert err.count("\n") == 1


def test_main_produce_raw_with_id_field_is_usage_error(capsys):
    code, _, err = _run(capsys, "produce", "s", "--raw", "--id-field", "id")
    assert (code, err) == (2, "npstream: error: --id-field and --key-field need JSON input; "
                              "drop --raw\n")


def test_main_produce_missing_file_is_usage_error(capsys, tmp_path):
    missing = tmp_path / "nope.jsonl"
    code, _, err = _run(capsys, "produce", "s", str(missing), "--broker", "127.0.0.1:1")
    assert code == 2
    assert err == f"npstream: error: cannot read {missing}: No such file or directory\n"


def test_main_unreachable_broker_exits_1_naming_address(capsys):
    code, out, err = _run(capsys, "streams", "list", "--broker", "127.0.0.1:1",
                          "--retry-deadline", "0")
    assert code == 1 and out == ""
    assert err.startswith("npstream: error: broker at 127.0.0.1:1 is unavailable: ")
    assert err.count("\n") == 1


def test_parser_client_options_default_from_environment(monkeypatch):
    monkeypatch.setenv("NPSTREAM_BROKER", "b:1")
    monkeypatch.setenv("NPSTREAM_TOKEN", "sekret")
    args = build_parser().parse_args(["streams", "describe", "s"])
    assert (args.broker, args.token, args.timeout, args.retry_deadline) == (
        "b:1", "sekret", 30.0, 15.0)
    monkeypatch.delenv("NPSTREAM_BROKER")
    monkeypatch.delenv("NPSTREAM_TOKEN")
    args = build_parser().parse_args(["consume", "s"])
    assert (args.broker, args.token, args.start, args.follow, args.max, args.group) == (
        "localhost:7070", None, "earliest", False, None, None)


def test_parser_durations_and_sizes_are_kept_as_typed_for_the_client():
    args = build_parser().parse_args(
        ["streams", "create", "s", "--max-age", "7d", "--max-bytes", "1GiB",
         "--dedup-window", "2m", "--max-message-bytes", "1MiB", "--exist-ok"])
    assert (args.max_age, args.max_bytes, args.dedup_window, args.max_message_bytes,
            args.exist_ok) == ("7d", "1GiB", "2m", "1MiB", True)
