"""Every named axis is a Registry: duplicates refused, unknown names answered with the key and the valid names."""

from __future__ import annotations

import pytest

from agon.core.grpo import LOSSES
from agon.records.loggers import LOGGERS
from agon.core.registry import Registry
from agon.core.rewards import REWARD_MODES


def test_duplicate_registration_is_refused():
    reg: Registry = Registry("thing.name")
    reg.register("a")(len)
    with pytest.raises(ValueError, match="thing.name 'a' is already registered"):
        reg.register("a")(len)


@pytest.mark.parametrize("registry,key,names", [
    (LOSSES, "trainer.loss_type", {"grpo", "dr_grpo", "dapo"}),
    (REWARD_MODES, "reward.name", {"competitive", "cooperative", "paper"}),
    (LOGGERS, "logger.name", {"none"}),
])
def test_unknown_names_list_the_valid_ones(registry, key, names):
    assert names <= set(registry)
    with pytest.raises(KeyError) as err:
        registry.get_or_raise("nonsense")
    assert key in str(err.value) and all(n in str(err.value) for n in names)
