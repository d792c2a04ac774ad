"""Tests for operator mutants that survived the test files tools/mutation.py maps to their module: each shows a
behaviour those files left open (the mutant it kills is named in its docstring)."""

from __future__ import annotations

import pytest

from agon.core.config import ConfigError
from agon.records.loggers import LOGGERS, Logger
from agon.run import run

EXIT_CODES = "test-exit-codes"


@pytest.fixture
def exit_codes():
    """A logger (agon's plugin interface, as W&B's is) that keeps the exit code each run finished it with."""
    codes: list[int] = []

    class Recording(Logger):
        def finish(self, exit_code: int = 0) -> None:
            codes.append(exit_code)

    LOGGERS.register(EXIT_CODES)(lambda cfg, run_dir: Recording())
    yield codes
    LOGGERS.pop(EXIT_CODES)


def test_a_run_finishes_its_logger_as_succeeded_and_a_failing_run_as_failed(small_cfg, exit_codes, tmp_path):
    """W&B shows a run as crashed or finished by the exit code it is finished with (agon/run.py ``exit_code = 0``
    -> 1 showed every finished run as crashed; the mapped tests log nowhere)."""
    small_cfg.logger.name = EXIT_CODES
    small_cfg.trainer.max_steps, small_cfg.eval.at_start = 1, False
    run(small_cfg)
    assert exit_codes == [0]
    # a run that fails once its logger is up: its prompts and token budget do not fit the test world's context
    # (256 tokens), which only the loaded tokenizer shows
    small_cfg.output_dir = str(tmp_path / "too-long")
    small_cfg.trainer.max_new_tokens = 300
    with pytest.raises(ConfigError, match="trainer.max_new_tokens"):
        run(small_cfg)
    assert exit_codes == [0, 1]
