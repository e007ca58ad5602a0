"""Durations, tables and error messages of the CLI (no server)."""

import pytest

from sluice_cli.client import error_lines, exit_code_for
from sluice_cli.output import fmt_duration, parse_duration, table


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("2h30m", 9000), ("90m", 5400), ("1d", 86400), ("45s", 45), ("1h30m15s", 5415), ("2H", 7200)],
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["90", "", "h", "0m", "2h-1m", "1.5h"])
def test_parse_duration_refuses(text):
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (45, "45s"), (90, "1m30s"), (3600, "1h"), (3605, "1h"), (9000, "2h30m"),
     (90061, "1d1h"), (259200, "3d"), (None, "-")],
)  # fmt: skip
def test_fmt_duration(seconds, text):
    assert fmt_duration(seconds) == text


def test_table_aligns_columns_and_numbers_right():
    text = table(
        ["id", "name", "gpus"], [[1, "a", 2], [22, "bbbb", 16], [3, None, 0]], right=["id", "gpus"]
    )

    assert text.splitlines() == [
        "ID  NAME  GPUS",
        " 1  a        2",
        "22  bbbb    16",
        " 3  -        0",
    ]


def test_error_lines_name_the_fields():
    body = {
        "detail": "Invalid input: gpus_per_node: Ensure this value is less than or equal to 64.",
        "errors": {
            "gpus_per_node": ["Ensure this value is less than or equal to 64."],
            "non_field_errors": ["Something about the whole."],
        },
    }
    assert error_lines(body) == [
        "gpus_per_node: Ensure this value is less than or equal to 64.",
        "Something about the whole.",
    ]
    assert error_lines({"detail": "Job not found.", "errors": {}}) == ["Job not found."]
    business = {
        "detail": "Queue is closed.",
        "code": "queue_closed",
        "errors": {"queue": ["Queue is closed."]},
    }
    assert error_lines(business) == ["queue: Queue is closed."]


@pytest.mark.parametrize(
    ("status", "code"),
    [(400, 1), (403, 1), (409, 1), (429, 1), (404, 3), (401, 4), (500, 5), (502, 5)],
)
def test_exit_codes_by_status(status, code):
    assert exit_code_for(status) == code
