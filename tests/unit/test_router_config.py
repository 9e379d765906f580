"""RouterConfig: validation, and flags/env through kvserve.settings."""

from __future__ import annotations

import argparse
import hashlib
import socket
from pathlib import Path

import pytest

from kvpool.config import PoolConfig
from kvpool.master import master_metrics_address
from kvserve.settings import add_config_args, config_from_args
from router.api.auth import bare_key_tenant
from router.config import RouterConfig
from router.control.ratio import RatioConfig


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
        ({"router_id": "a b"}, "router_id"),
        ({"router_id": "r/1"}, "router_id"),
        ({"router_id": "r" * 65}, "router_id"),
        ({"router_id": "é"}, "router_id"),
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


def test_the_router_id_is_given_or_the_host_and_port(monkeypatch: pytest.MonkeyPatch) -> None:
    for given in ("router-0", "r" * 64, "10.0.0.5:8001", "a_b.c"):
        assert RouterConfig(router_id=given).resolved_router_id() == given
    monkeypatch.setattr(socket, "gethostname", lambda: "node-7.example")
    assert RouterConfig(router_port=8001).resolved_router_id() == "node-7.example:8001"
    monkeypatch.setattr(socket, "gethostname", lambda: "odd host/" + "h" * 80)
    odd = RouterConfig(router_port=8001).resolved_router_id()
    assert odd == ("odd_host_" + "h" * 80)[:59] + ":8001"
    assert RouterConfig(router_id=odd) is not None  # a valid id
    monkeypatch.setenv("KVSERVE_ROUTER_ID", "from-env")
    parser = argparse.ArgumentParser()
    add_config_args(parser, RouterConfig)
    assert config_from_args(RouterConfig, parser.parse_args([])).router_id == "from-env"
    flagged = config_from_args(RouterConfig, parser.parse_args(["--router-id", "router-1"]))
    assert flagged.resolved_router_id() == "router-1"
    assert "KVSERVE_ROUTER_ID" in parser.format_help()


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
    assert cfg.api_keys.tenant_of("sk-two") == bare_key_tenant(hashlib.sha256(b"sk-two").digest())
    assert cfg.admission_ttft_s == 30.0
