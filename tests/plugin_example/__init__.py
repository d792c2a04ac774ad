"""A package outside agon that adds a task, a reward and a method, as a user's own would (docs/extending.md walks
through it). Nothing in agon names it: a run imports it with ``plugins=[tests.plugin_example]`` and finds its yaml
with ``hydra.searchpath=[file://<this folder>/conf]``."""

from tests.plugin_example import method, reward, task  # noqa: F401  (each registers itself on import)
