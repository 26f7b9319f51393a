"""The run config: ``schema`` (RunConfig and its sections), ``kubernetes`` (the pod spec section,
validated before any pod exists), ``load`` (YAML with ``extends:``, conf overlay, ``--set``),
``base`` (what every section shares). Callers import from here."""

from pipelines.config.base import ConfigError
from pipelines.config.kubernetes import KubernetesConfig, check_label, image_problem
from pipelines.config.load import apply_overrides, deep_merge, load_config, read_yaml_chain, suggest, validate
from pipelines.config.schema import (
    SECTIONS,
    CheckpointConfig,
    ComputeConfig,
    DataConfig,
    EvalConfig,
    ModelConfig,
    PackConfig,
    PreflightConfig,
    RefreshConfig,
    RegistryConfig,
    RunConfig,
    TokenizerConfig,
    TrainConfig,
)

__all__ = ["SECTIONS", "CheckpointConfig", "ComputeConfig", "ConfigError", "DataConfig", "EvalConfig",
           "KubernetesConfig", "ModelConfig", "PackConfig", "PreflightConfig", "RefreshConfig", "RegistryConfig", "RunConfig",
           "TokenizerConfig", "TrainConfig", "apply_overrides", "check_label", "deep_merge", "image_problem",
           "load_config", "read_yaml_chain", "suggest", "validate"]
