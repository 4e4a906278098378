"""report_data_loss: the one reaction to messages that are gone (pure, no broker)."""

from __future__ import annotations

import logging

import pytest

from npstream.spark.data_loss import DataLossError, report_data_loss


def test_report_data_loss_fail_raises_with_stream_offsets_and_fix():
    with pytest.raises(DataLossError) as info:
        report_data_loss("orders", 10, 40, "retention moved the stream's start_offset to 40",
                         fail=True)
    assert str(info.value) == (
        "Data loss on stream 'orders': offsets [10, 40) can no longer be read (retention "
        "moved the stream's start_offset to 40). If skipping the missing messages is "
        "acceptable, set the option failOnDataLoss=false and restart the query.")
    assert (info.value.stream, info.value.start, info.value.end) == ("orders", 10, 40)


def test_report_data_loss_without_end_says_and_later():
    with pytest.raises(DataLossError, match=r"offsets 7 and later can no longer be read"):
        report_data_loss("s", 7, None, "the stream was deleted", fail=True)


def test_report_data_loss_skip_logs_one_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="npstream.spark.data_loss"):
        report_data_loss("orders", 10, 40, "gone", fail=False)
    assert [r.getMessage() for r in caplog.records] == [
        "data loss on stream 'orders': skipping offsets [10, 40) (gone); failOnDataLoss=false"]
    assert caplog.records[0].levelno == logging.WARNING
