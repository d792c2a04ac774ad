"""agon's Hydra plugins: the Optuna sweeper (``optuna_sweeper.OptunaSweeper``)."""
