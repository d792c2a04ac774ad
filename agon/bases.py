"""``python -m agon.bases --ship [NAME ...]`` (``make bases``): rebuild the offline worlds shipped in ``bases/``.

Each world that ``bases/worlds.yaml`` lists is composed as a run would compose it, built from scratch in a
temporary cache (``agon.models.world.ensure_world``), copied to ``bases/tiny-<key>/`` and hashed into the manifest that
every load checks (read through ``agon.models.world`` at call time, so a test that points ``world.BASES`` elsewhere
ships there). A tool above the core: it composes configs (``agon.training.checks``), which the world itself never does.
Left out on purpose: shipping any other model (real checkpoints come from the hub or ``model.path``).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

from agon.models import world
from agon.training.checks import compose_config


def ship(names: list[str] | None = None, log=print) -> dict[str, str]:
    """Build the worlds ``bases/worlds.yaml`` lists (``names``: some of them) on this machine, store them as
    ``bases/tiny-<key>/`` and rewrite the manifest; a shipped world no longer listed is removed. {name: key}."""
    import yaml

    listed = yaml.safe_load((world.BASES / "worlds.yaml").read_text())
    unknown = sorted(set(names or ()) - set(listed))
    if unknown:
        raise ValueError(f"no world named {unknown} in {world.BASES / 'worlds.yaml'} (it lists {sorted(listed)})")
    keys, shipped = {}, {}
    for name, overrides in listed.items():
        cfg = compose_config(list(overrides))
        keys[name] = f"tiny-{world.world_key(cfg.model, world.world_task_cfg(cfg.task))}"
        if names and name not in names:
            continue
        with tempfile.TemporaryDirectory() as cache:
            previous = {k: os.environ.get(k) for k in ("AGON_CACHE", world.SHIPPED_ENV)}
            os.environ.update({"AGON_CACHE": cache, world.SHIPPED_ENV: "0"})
            try:
                built = world.ensure_world(cfg.model, cfg.task, log=log)
            finally:
                for k, v in previous.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
            target = world.BASES / keys[name]
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(built, target)
            target.chmod(0o755)  # readable by every user of the checkout, as git would leave it
            for f in target.iterdir():
                f.chmod(0o644)
        shipped[keys[name]] = world.base_hashes(target)
        log(f"[world] shipped {name} as {target}")
    # read again now, not at the start: another --ship of other worlds may have finished while this one built
    manifest = {**world.read_manifest(world.BASES), **shipped}
    for name, key in keys.items():  # listed and on disk but not in the manifest: shipped by an unfinished --ship
        if key not in manifest and (world.BASES / key / "world.json").is_file():
            manifest[key] = world.base_hashes(world.BASES / key)
    for stale in set(manifest) - set(keys.values()):
        shutil.rmtree(world.BASES / stale, ignore_errors=True)
        manifest.pop(stale)
    (world.BASES / world.MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return keys


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="the offline worlds shipped in bases/")
    parser.add_argument("--ship", nargs="*", metavar="NAME", help="rebuild these shipped worlds (all when none named)")
    args = parser.parse_args()
    if args.ship is None:
        parser.error("nothing to do: --ship [NAME ...]")
    print(json.dumps(ship(args.ship or None), indent=1))
