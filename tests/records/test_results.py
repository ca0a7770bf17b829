"""The jobs' result line: the jobs write it, the operator, demo and benchmarks parse it."""

from __future__ import annotations

import pytest

from kafka_group_records import results


def test_a_written_line_parses_back_to_its_document() -> None:
    document = {"records": 3, "group": "shop.orders", "nested": {"b": [1, None], "a": "x\ny"}}
    line = results.result_line(document)
    assert line == (
        'KGO-RESULT {"group": "shop.orders", "nested": {"a": "x\\ny", "b": [1, null]},'
        ' "records": 3}'
    )
    assert "\n" not in line
    output = f"spark says hello\n{line}\nwarning-free trailer\n"
    assert results.parse_result(output) == document


def test_the_last_result_line_wins_and_none_is_none() -> None:
    output = f"{results.result_line({'n': 1})}\n{results.result_line({'n': 2})}\n"
    assert results.parse_result(output) == {"n": 2}
    assert results.parse_result("no result here\nKGO-RESULTS {}\n") is None


@pytest.mark.parametrize("body", ["{not json", "[1, 2]", '"text"'])
def test_a_broken_result_line_is_a_result_error(body: str) -> None:
    with pytest.raises(results.ResultError):
        results.parse_result(f"KGO-RESULT {body}\n")
