"""One typed config tree for both workers: YAML overrides the defaults, `a.b=c` overrides YAML.

Every knob is a dataclass field with a default and a one-line `help`; YAML files only override.
Unknown keys and bad values stop the run with one line naming the key and what is allowed.
"""

from grpo.config.errors import ConfigError
from grpo.config.loading import (
    describe,
    get_value,
    load_config,
    parse_override,
    save_config,
    to_dict,
)
from grpo.config.sampling import (
    DataConfig,
    RewardConfig,
    RolloutConfig,
    VllmConfig,
)
from grpo.config.sections import (
    VARLEN_ATTENTION,
    AlgoConfig,
    Config,
    CriticConfig,
    EvalConfig,
    LoraConfig,
    ModelConfig,
    TrainConfig,
    TransportConfig,
    WeightsConfig,
)

__all__ = [
    "VARLEN_ATTENTION",
    "AlgoConfig",
    "Config",
    "ConfigError",
    "CriticConfig",
    "DataConfig",
    "EvalConfig",
    "LoraConfig",
    "ModelConfig",
    "RewardConfig",
    "RolloutConfig",
    "TrainConfig",
    "TransportConfig",
    "WeightsConfig",
    "VllmConfig",
    "describe",
    "get_value",
    "load_config",
    "parse_override",
    "save_config",
    "to_dict",
]
