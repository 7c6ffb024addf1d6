"""Pages of a lazy view of the cache equal pages of the same pairs in a list."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from podnet.api.cachedobjects import CachedObject, KeyedView
from podnet.api.listing import page_of
from podnet.api.params import ContinueToken, QueryParams

names = st.lists(st.text("abc/", min_size=1, max_size=4), unique=True, max_size=30)


@given(keys=names, limit=st.integers(0, 8), after=st.none() | st.text("abc/", max_size=4))
def test_view_pages_equal_list_pages(keys: list[str], limit: int, after: str | None) -> None:
    keys = sorted(keys)
    items = {key: CachedObject(key.encode(), 3, {}) for key in keys}
    view = KeyedView(keys, items)
    pairs = [(key, items[key]) for key in keys]
    token = None if after is None else ContinueToken(3, after)
    params = QueryParams(limit=limit, continue_token=token)
    lazy, eager = page_of(view, 9, params), page_of(pairs, 9, params)
    assert lazy == eager
    assert len(view) == len(keys)
    assert list(view) == pairs
    assert list(view[1:3]) == pairs[1:3]
