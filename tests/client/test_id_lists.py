"""Job ids as typed on the command line (`cancel 15-20`, `cancel 15,16`) and as `show`
prints a job's parents: ranges and lists both ways."""

from __future__ import annotations

import pytest

from supervisor.client.arrays import job_ids
from supervisor.client.render import ids_text
from supervisor.wire.sizes import ConfigError


def test_ranges_lists_and_plain_ids_mix_each_id_once_in_order() -> None:
    assert job_ids(["15-17"], "cancel") == [15, 16, 17]
    assert job_ids(["15,16"], "cancel") == [15, 16]
    assert job_ids(["3,7-9", "12", "8"], "cancel") == [3, 7, 8, 9, 12]
    assert job_ids(["5-5"], "cancel") == [5]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("15-", "'15-' is not a job id, a range like 15-20 or a list like 15,16"),
        ("-3", "is not a job id"),
        ("a", "is not a job id"),
        ("15,,16", "'' is not a job id"),
        ("0", "'0' is not a job id"),
        ("1-2-3", "is not a job id"),
        ("20-15", "the range '20-15' is empty"),
        ("1-200000", "more than 100000 jobs"),
    ],
)
def test_a_bad_id_is_a_usage_error_that_names_it(text: str, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        job_ids([text], "cancel")


def test_parents_print_as_ranges() -> None:
    assert ids_text([]) == "-"
    assert ids_text([3, 4]) == "3, 4"
    assert ids_text([9, 3, 4, 5, 6, 12, 13]) == "3-6, 9, 12, 13"
