"""`python -m grpo.config CONFIG [overrides] [--get key]`: validate and print, or read one key."""

import sys

import yaml

from grpo.config import ConfigError, describe, get_value, load_config, to_dict


def main(argv: list[str]) -> int:
    """`python -m grpo.config CONFIG [overrides] [--get key]`: validate and print, or read one
    key. Looking up the names of the loss, estimator, task and engine is `python -m grpo check`
    (it imports the registries, torch and all)."""
    if argv and argv[0] == "--help-keys":
        print("\n".join(describe()))
        return 0
    get = None
    if "--get" in argv:
        i = argv.index("--get")
        get, argv = argv[i + 1], argv[:i] + argv[i + 2 :]
    try:
        cfg = load_config(argv[0] if argv else None, argv[1:])
        print(get_value(cfg, get) if get else yaml.safe_dump(to_dict(cfg), sort_keys=False))
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
