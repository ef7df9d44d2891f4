"""A per-process value built on first use."""

from __future__ import annotations

from chokaq_core.lazy import Lazy


def test_a_lazy_value_is_built_once_and_again_after_reset() -> None:
    built: list[object] = []

    def build() -> object:
        built.append(object())
        return built[-1]

    value = Lazy(build)
    assert built == []
    first = value()
    assert value() is first and len(built) == 1
    value.reset()
    second = value()
    assert second is not first and len(built) == 2
