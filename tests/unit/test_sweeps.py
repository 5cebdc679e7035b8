"""The sweep helper (tests/sweeps.py): the quick share covers every value, the whole product is there."""

import itertools

from sweeps import each_choice, seeds


def _quick(param) -> bool:
    return not any(m.name == "slow" for m in param.marks)


def test_each_choice_is_the_whole_product_with_every_value_in_a_quick_combination():
    factors = (["a", "b", "c"], [("x", 1), ("y", 2)], [True, False])
    params = each_choice(*factors)
    whole = [(p, *q, r) for p, q, r in itertools.product(*factors)]
    assert [p.values for p in params] == whole
    quick = [p.values for p in params if _quick(p)]
    for position, values in ((0, "abc"), (1, "xy"), (2, (True, False))):
        column = 3 if position == 2 else position
        assert {v[column] for v in quick} == set(values)
    assert len(quick) < len(whole)


def test_seeds_keeps_every_strideth_seed_quick():
    params = seeds(range(10), stride=4)
    assert [p.values for p in params] == [(s,) for s in range(10)]
    assert [p.values[0] for p in params if _quick(p)] == [0, 4, 8]
