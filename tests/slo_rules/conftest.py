from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.slo_rules.receivers import Receiver


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver().start()
    try:
        yield r
    finally:
        r.stop()
