"""agon: two LoRA adapters on one frozen base model compete in a draft-and-challenge RL game.

Entry points: ``python -m agon.run`` (train and evaluate one config, ``-m`` for a sweep), ``python -m agon.eval``
(re-evaluate a finished run), ``python -m agon.bases`` (rebuild the shipped offline worlds). The library is grouped
by layer, one folder each, a folder importing only from those below it (``make lint``): ``core`` (config schemas,
registries, the algorithm as pure tensor functions), ``tasks``, ``families`` and ``records``, ``models``,
``engines``, ``game``, ``training``; the measurement tools are ``agon.bench`` (``python -m agon.bench``), which
nothing in the library imports. Modules are imported lazily by the entry points; importing ``agon`` itself loads
nothing heavy.
"""

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

__version__ = "0.1.0"

# the extension API's paths from before the modules moved into folders (a plugin's ``from agon.rewards import ...``):
# each still imports, as the very module of its new path, with a DeprecationWarning that names the new path
MOVED = {"agon.config": "agon.core.config", "agon.rewards": "agon.core.rewards", "agon.methods": "agon.core.methods"}


class _MovedModule(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old paths in ``MOVED`` and loads each as the module at its new path (one module, two names)."""

    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name in MOVED else None

    def create_module(self, spec):
        warnings.warn(f"{spec.name} is now {MOVED[spec.name]}: import it from there", DeprecationWarning,
                      stacklevel=2)
        module = importlib.import_module(MOVED[spec.name])
        spec.loader_state = module.__spec__  # the import system writes the old path's spec over it; put it back
        return module

    def exec_module(self, module):
        module.__spec__ = module.__spec__.loader_state


if not any(isinstance(finder, _MovedModule) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModule())
