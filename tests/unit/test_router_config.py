"""RouterConfig: validation, and flags/env through kvserve.settings."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from kvpool.config import PoolConfig
from kvpool.master import master_metrics_address
from kvserve.settings import add_config_args, config_from_args
from router.config import RouterConfig
from router.ratio import RatioConfig


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"router_port": 0}, "router_port"),
        ({"policy": "fastest"}, "policy must be one of"),
        ({"disagg_threshold_tokens": -1}, "disagg_threshold_tokens"),
        ({"reserve_lease_s": 0.0}, "reserve_lease_s"),
        ({"request_timeout_s": -1.0}, "request_timeout_s"),
        ({"max_body_bytes": 10}, "max_body_bytes"),
        ({"tokenizer_dir": "/nonexistent"}, "no tokenizer.json"),
        ({"controller_interval_s": 0.0}, "controller_interval_s"),
        ({"admission_ttft_s": -1.0}, "admission_ttft_s"),
        ({"admission_ttft_s": float("nan")}, "admission_ttft_s"),
        ({"api_key": "alice="}, "api_key entry 1"),
    ],
)
def test_rejects_bad_values(fields: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        RouterConfig(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("url", "match"),
    [("127.0.0.1:9003", "master_metrics_url"), ("http://127.0.0.1/metrics", "explicit port")],
)
def test_the_master_metrics_url_is_checked(url: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PoolConfig(master_metrics_url=url)
    assert PoolConfig(pool_master="10.0.0.9:50051").metrics_url == "http://10.0.0.9:9003/metrics"


def test_defaults_and_helpers(tmp_path: Path) -> None:
    cfg = RouterConfig()
    assert (cfg.router_host, cfg.router_port, cfg.policy) == ("127.0.0.1", 8000, "cache_aware")
    assert cfg.reserve_lease_ms == 30000
    assert cfg.api_key == "" and not cfg.api_keys.enabled
    assert cfg.isolate_tenants and cfg.admission_ttft_s == 0.0
    assert master_metrics_address("http://10.0.0.2:9003/metrics") == ("10.0.0.2", 9003)
    (tmp_path / "tokenizer.json").write_text("{}")
    assert RouterConfig(tokenizer_dir=str(tmp_path)).tokenizer_dir == str(tmp_path)


def test_flags_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVSERVE_POLICY", "round_robin")
    monkeypatch.setenv("KVSERVE_POOL_LOOKUP", "false")
    parser = argparse.ArgumentParser()
    add_config_args(parser, RouterConfig)
    ns = parser.parse_args(["--router-port", "9100", "--disagg-threshold-tokens", "0"])
    cfg = config_from_args(RouterConfig, ns)
    assert cfg == RouterConfig(
        router_port=9100, policy="round_robin", disagg_threshold_tokens=0, pool_lookup=False
    )


def test_controller_settings_are_the_ratio_config_with_a_prefix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """RatioConfig is defined once: its fields become --controller-<field> flags and
    KVSERVE_CONTROLLER_<FIELD> variables with its own defaults, docs and checks."""
    cfg = RouterConfig()
    assert not cfg.controller and cfg.controller_interval_s == 5.0
    assert cfg.ratio == RatioConfig() == RatioConfig(ttft_slo_s=2.0, tpot_slo_s=0.1)
    monkeypatch.setenv("KVSERVE_CONTROLLER_MAX_DECODE", "3")
    parser = argparse.ArgumentParser()
    add_config_args(parser, RouterConfig)
    ns = parser.parse_args(["--controller", "--controller-patience", "1"])
    parsed = config_from_args(RouterConfig, ns)
    assert parsed.controller and parsed.ratio == RatioConfig(patience=1, max_decode=3)
    assert "consecutive evaluations" in parser.format_help()  # RatioConfig's own docs
    bad = parser.parse_args(["--controller-target", "2"])
    with pytest.raises(ValueError, match="target must be an attainment"):
        config_from_args(RouterConfig, bad)


def test_api_key_from_the_environment_and_never_in_repr(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVSERVE_API_KEY", "sk-one,alice=sk-alice")
    parser = argparse.ArgumentParser()
    add_config_args(parser, RouterConfig)
    assert "sk-" not in parser.format_help()
    cfg = config_from_args(RouterConfig, parser.parse_args(["--no-isolate-tenants"]))
    assert cfg.api_key == "sk-one,alice=sk-alice" and not cfg.isolate_tenants
    assert cfg.api_keys.tenant_of("sk-alice") == "alice"
    assert "sk-" not in repr(cfg) and "api_key" not in repr(cfg)
    ns = parser.parse_args(["--api-key", "sk-two", "--admission-ttft-s", "30"])
    cfg = config_from_args(RouterConfig, ns)
    assert cfg.api_keys.tenant_of("sk-two") == "" and cfg.admission_ttft_s == 30.0
