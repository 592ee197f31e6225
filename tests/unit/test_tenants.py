"""Tenant settings as the CLI and the registry give them (the rules: test_contract_tenants.py)."""

from __future__ import annotations

import pytest

from gpuq.errors import TenantError
from gpuq.tenants import Tenant


def test_a_spec_names_weight_and_caps_left_to_right() -> None:
    assert Tenant.from_spec("shop") == Tenant("shop")
    assert Tenant.from_spec("shop:3") == Tenant("shop", 3.0)
    assert Tenant.from_spec("shop:3:4") == Tenant("shop", 3.0, 4)
    assert Tenant.from_spec("shop:-:-:80") == Tenant("shop", 1.0, None, 80.0)
    for bad in ("shop:x", "shop:1:2.5", "shop:1:2:3:4", ":1", "a b:1", "shop:0"):
        with pytest.raises(TenantError):
            Tenant.from_spec(bad)


def test_a_stored_value_reads_back_or_is_ignored_when_malformed() -> None:
    t = Tenant("shop", 2.5, 4, None)
    assert Tenant.parse("shop", "2.5 4 -") == t and t.capped
    assert not Tenant("free").capped
    for bad in ("", "2", "x 1 -", "0 - -", "1 1.5 -", "1 - nan"):
        assert Tenant.parse("shop", bad) is None


def test_a_bad_name_is_said_in_one_short_line() -> None:
    """Found by a QA pass: a 5,000-character name was echoed whole, with the wrong reason."""
    with pytest.raises(TenantError, match="longer than 200 characters") as info:
        Tenant("x" * 5000)
    assert len(str(info.value)) < 200
    for bad in ("a\x01", "t\x1b[31m", "a\x7fb", "a b", "{t}"):
        with pytest.raises(TenantError, match="control characters"):
            Tenant(bad)


def test_a_name_over_200_bytes_in_utf8_is_refused_here_with_its_reason() -> None:
    """Found by a QA pass: 150 'é' (300 bytes) passed the client's check, then the script
    refused it ('tenant must be a non-empty name'): the scripts count bytes."""
    with pytest.raises(TenantError, match="longer than 200 bytes"):
        Tenant("é" * 150)
    assert Tenant("é" * 100).name == "é" * 100  # 200 bytes: fine
