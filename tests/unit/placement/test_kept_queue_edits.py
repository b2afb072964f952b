"""A kept queue's sorted keys edited in place (`kept_queue._edited`) equal the keys sorted
afresh, whether few change (one by one) or many (filtered and sorted once)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpuloom.placement.incremental.queue import _ONE_BY_ONE, _edited

KEY = st.tuples(
    st.tuples(
        st.integers(-3, 3),
        st.tuples(st.integers(0, 50), st.integers(0, 3), st.text("ab", max_size=2)),
    ),
    st.text("abc", max_size=3),
)


@given(
    keys=st.sets(KEY, max_size=3 * _ONE_BY_ONE),
    data=st.data(),
)
def test_edited_keys_are_the_keys_sorted_afresh(keys: set, data: st.DataObject) -> None:
    ordered = sorted(keys)
    left = data.draw(st.lists(st.sampled_from(ordered), unique=True) if ordered else st.just([]))
    added = data.draw(st.lists(KEY, unique=True, max_size=2 * _ONE_BY_ONE))
    added = [key for key in added if key not in keys or key in left]
    expected = sorted((keys - set(left)) | set(added))
    assert _edited(list(ordered), left, added) == expected


def test_both_ways_of_editing_are_taken() -> None:
    """Few changes go one by one, many at once; both give the sorted keys."""
    ordered = [((0, (i, 0, "")), f"j{i}") for i in range(4 * _ONE_BY_ONE)]
    for count in (1, _ONE_BY_ONE, _ONE_BY_ONE + 1, 3 * _ONE_BY_ONE):
        left = ordered[::2][:count]
        added = [((-1, (i, 0, "")), f"new{i}") for i in range(count)]
        expected = sorted((set(ordered) - set(left)) | set(added))
        assert _edited(list(ordered), left, added) == expected
