"""Session settings: one compared form for what a class was qualified with and what a host's
session runs with, and a wire encoding that survives any text."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas.project import ProviderSpec
from schemas.settings import (
    CORE_KEYS,
    MAX_SETTINGS_CHARS,
    decode_settings,
    encode_settings,
    qualified_settings,
    settings_differences,
)


def test_an_unset_provider_section_is_onnxruntimes_defaults() -> None:
    assert qualified_settings(ProviderSpec().model_dump(mode="json")) == {
        "execution_mode": "sequential",
        "graph_optimization_level": "all",
        "inter_op_threads": "0",
        "intra_op_threads": "0",
    }


def test_every_setting_of_a_provider_section_is_in_the_compared_form() -> None:
    spec = ProviderSpec(
        execution_providers=["CUDAExecutionProvider", "CPUExecutionProvider"],
        intra_op_threads=2,
        execution_mode="parallel",
        graph_optimization_level="extended",
        session_config={"session.intra_op.allow_spinning": False, "session.x64quantprecision": 1},
        provider_options={
            "CUDAExecutionProvider": {"device_id": 0, "cudnn_conv_use_max_workspace": True}
        },
        strict_fallback=True,
        cpu_affinity=[3, 1, 1],
    )
    got = qualified_settings(spec.model_dump(mode="json"))
    assert got == {
        "config:session.disable_cpu_ep_fallback": "1",
        "config:session.intra_op.allow_spinning": "0",
        "config:session.x64quantprecision": "1",
        "cpu_affinity": "1,3",
        "execution_mode": "parallel",
        "graph_optimization_level": "extended",
        "inter_op_threads": "0",
        "intra_op_threads": "2",
        "option:CUDAExecutionProvider:cudnn_conv_use_max_workspace": "1",
        "option:CUDAExecutionProvider:device_id": "0",
    }
    assert list(got) == sorted(got)


_text = st.text(min_size=0, max_size=40)


@given(st.dictionaries(st.text(min_size=1, max_size=30), _text, max_size=8), _text, _text)
def test_any_settings_survive_the_wire_encoding(extra: dict[str, str], a: str, b: str) -> None:
    settings = {**extra, **dict.fromkeys(CORE_KEYS, a), "intra_op_threads": b}
    text = encode_settings(settings)
    assert "\n" not in text
    assert decode_settings(text) == settings


@given(st.text(max_size=200))
def test_decoding_hostile_text_raises_value_error_or_returns_the_core_keys(text: str) -> None:
    try:
        got = decode_settings(text)
    except ValueError:
        return
    assert set(CORE_KEYS) <= set(got)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "lack"),
        ("intra_op_threads", "not key=value"),
        ("=1", "not key=value"),
        ("execution_mode=a;execution_mode=b", "twice"),
        ("x" * (MAX_SETTINGS_CHARS + 1), "longer"),
    ],
)
def test_malformed_settings_name_what_is_wrong(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        decode_settings(text)


def test_differences_name_the_key_the_host_value_and_the_qualified_one() -> None:
    qualified = qualified_settings({"intra_op_threads": 2})
    observed = {
        **qualified,
        "intra_op_threads": "4",
        "config:session.intra_op.allow_spinning": "0",
        "cpu_affinity": "0,1",  # the class does not pin: not compared
    }
    assert settings_differences(qualified, observed) == [
        "config:session.intra_op.allow_spinning 0, qualified unset",
        "intra_op_threads 4, qualified 2",
    ]
    assert settings_differences(qualified, dict(qualified)) == []
