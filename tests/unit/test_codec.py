"""Annotation codecs (hami.core.codec): HAMi v2.10 literal strings, errors, round trips."""

from __future__ import annotations

import contextlib
import json
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami.core.codec import (
    CodecError,
    Handshake,
    MigAllocation,
    MigRuntimeIdentity,
    NodeLock,
    ScoringWeights,
    decode_handshake,
    decode_mig_allocations,
    decode_node_devices,
    decode_node_devices_json,
    decode_node_devices_legacy,
    decode_node_lock,
    decode_node_scores,
    decode_pod_devices,
    encode_handshake,
    encode_mig_allocations,
    encode_node_devices,
    encode_node_devices_legacy,
    encode_node_lock,
    encode_pod_devices,
    is_handshake_requesting,
    parse_scoring_weights,
    served_pod_devices,
)
from hami.core.gowire import go_json_string, go_quote, parse_go_bool, parse_go_int
from hami.core.model import ContainerDevice, DeviceInfo, MigPlacement, MigProfile

P4 = "GPU-ebe7c3f7-303d-558d-435e-99a160631fe4"
LEGACY_P4 = f"{P4},10,7680,100,NVIDIA-Tesla P4,0,true,1,hami-core:"
P4_DEVICE = DeviceInfo(P4, 1, 10, 7680, 100, "NVIDIA-Tesla P4", 0, "hami-core", True)
PROFILE_JSON = (
    '{"name":"1g.5gb","memoryMB":4864,"core":15,"sliceCount":1,"placements":[{"start":6,"size":1}]}'
)
PROFILE = MigProfile("1g.5gb", 4864, 15, 1, (MigPlacement(6, 1),))
B14 = ";GPU-aaaa-0,NVIDIA,1000,0:;;;;"


# --- node register, JSON ------------------------------------------------------------------


def test_encode_node_devices_key_order_and_omitempty() -> None:
    full = DeviceInfo("GPU-0", 3, 10, 24576, 100, "NVIDIA-A10", 1, "hami-core", True)
    assert encode_node_devices([full]) == (
        '[{"id":"GPU-0","index":3,"count":10,"devmem":24576,"devcore":100,'
        '"type":"NVIDIA-A10","numa":1,"mode":"hami-core","health":true}]'
    )
    bare = DeviceInfo("GPU-1", 0, 10, 24576, 100, "NVIDIA-A10", 0, "", False)
    assert (
        encode_node_devices([bare])
        == '[{"id":"GPU-1","count":10,"devmem":24576,"devcore":100,"type":"NVIDIA-A10"}]'
    )
    assert encode_node_devices([DeviceInfo("", 0, 0, 0, 0, "", health=False)]) == "[{}]"
    assert encode_node_devices([]) == "[]"


def test_mig_profile_json_is_the_spec_example() -> None:
    device = DeviceInfo(
        "GPU-m", 0, 7, 40960, 100, "NVIDIA-A100", mode="mig", mig_profiles=(PROFILE,)
    )
    text = encode_node_devices([device])
    assert text == (
        '[{"id":"GPU-m","count":7,"devmem":40960,"devcore":100,"type":"NVIDIA-A100",'
        f'"mode":"mig","migProfiles":[{PROFILE_JSON}],"health":true}}]'
    )
    assert decode_node_devices(text) == (device,)


def test_mig_profile_without_placements_is_null_like_a_go_nil_slice() -> None:
    device = DeviceInfo(
        "GPU-m", 0, 1, 1, 100, "T", mig_profiles=(MigProfile("7g.80gb", 81920, 100, 7),)
    )
    text = encode_node_devices([device])
    assert '"placements":null' in text
    assert decode_node_devices(text) == (device,)


def test_negative_numa_is_written() -> None:
    assert '"numa":-1' in encode_node_devices([DeviceInfo("a", 0, 1, 1, 1, "t", numa=-1)])


@pytest.mark.parametrize(
    ("text", "escaped"),
    [
        ("a<b>&c", r'"a\u003cb\u003e\u0026c"'),
        ('q"\\', r'"q\"\\"'),
        ("\n\r\t\b\f", r'"\n\r\t\b\f"'),
        ("\x00\x1f\x7f", '"\\u0000\\u001f\x7f"'),
        ("\u2028\u2029", r'"\u2028\u2029"'),
        ("显卡 é", '"显卡 é"'),
    ],
)
def test_json_strings_escape_like_go(text: str, escaped: str) -> None:
    assert go_json_string(text) == escaped
    encoded = encode_node_devices([DeviceInfo("id", 0, 1, 1, 1, text)])
    assert f'"type":{escaped}' in encoded
    assert decode_node_devices(encoded)[0].type == text


def test_decode_json_missing_keys_are_zero_values() -> None:
    (device,) = decode_node_devices(
        '[{"id":"GPU-0","count":10,"devmem":100,"devcore":100,"type":"T"}]'
    )
    assert device == DeviceInfo("GPU-0", 0, 10, 100, 100, "T", 0, "", False)
    assert device.health is False  # missing health means unhealthy
    assert device.vendor == "NVIDIA"


def test_decode_json_case_insensitive_unknown_and_deprecated_keys() -> None:
    text = (
        '[{"ID":"GPU-0","Index":2,"COUNT":10,"DevMem":100,"devCore":50,"Type":"T","NUMA":1,'
        '"Mode":"mig","HEALTH":true,"devicevendor":"X","custominfo":{"a":[1]},'
        '"migtemplate":[[{"name":"1g","core":1,"memory":2,"count":3}]],"extra":{"x":null},'
        '"migprofiles":[{"NAME":"1g.5gb","memorymb":4864,"Core":15,"\u017fliceCount":1,'
        '"placement\u017f":[{"START":6,"Size":1}]}]}]'
    )
    assert decode_node_devices(text) == (
        DeviceInfo("GPU-0", 2, 10, 100, 50, "T", 1, "mig", True, (PROFILE,)),
    )


def test_decode_json_duplicates_last_wins_and_null_keeps_value() -> None:
    text = '[{"id":"a","id":"b","count":1,"Count":2,"type":"t","type":null,"health":true}]'
    assert decode_node_devices(text) == (DeviceInfo("b", 0, 2, 0, 0, "t", health=True),)


def test_decode_json_vendor_and_whitespace() -> None:
    (device,) = decode_node_devices(' \n[ {"id" : "a", "health": true} ]\t', vendor="MLU")
    assert device.vendor == "MLU"


def test_decode_json_null_profile_and_placement_entries_are_zero_structs() -> None:
    (device,) = decode_node_devices('[{"id":"a","migProfiles":[null,{"placements":[null]}]}]')
    assert device.mig_profiles == (
        MigProfile("", 0, 0, 0),
        MigProfile("", 0, 0, 0, (MigPlacement(0, 0),)),
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[]", "no gpu found on node"),
        ("null", "no gpu found on node"),
        ("{}", "cannot unmarshal object into Go value of type []*device.DeviceInfo"),
        ('"x"', "legacy"),  # not JSON-looking: read as legacy
        ("[null]", "device 0 is null"),
        ("[1]", "device 0: json: cannot unmarshal number 1 into Go value of type DeviceInfo"),
        (
            '[{"count":"10"}]',
            "cannot unmarshal string into Go struct field DeviceInfo.count of type int32",
        ),
        (
            '[{"count":1.0}]',
            "cannot unmarshal number 1.0 into Go struct field DeviceInfo.count of type int32",
        ),
        ('[{"count":1e2}]', "cannot unmarshal number 1E+2"),
        ('[{"count":2147483648}]', "of type int32"),
        ('[{"devmem":-2147483649}]', "of type int32"),
        ('[{"index":-1}]', "of type uint"),
        ('[{"numa":9223372036854775808}]', "of type int"),
        ('[{"health":"true"}]', "of type bool"),
        ('[{"health":1}]', "of type bool"),
        ('[{"id":5}]', "of type string"),
        ('[{"migProfiles":{}}]', "of type []MigProfile"),
        ('[{"migProfiles":[{"sliceCount":-1}]}]', "of type uint32"),
        ('[{"migProfiles":[{"placements":[{"size":4294967296}]}]}]', "of type uint32"),
        ('[{"custominfo":[]}]', "map[string]interface {}"),
        ('[{"migtemplate":[[{"Core":"x"}]]}]', "of type int32"),
        ('[{"id":"a"}', "invalid JSON"),
        ('[{"id":"a"}] x', "invalid JSON"),
        ('[{"count":NaN}]', "NaN"),
        ('[{"count":Infinity}]', "Infinity"),
        ("[" * 100000, "invalid JSON"),
    ],
)
def test_decode_json_errors(text: str, message: str) -> None:
    with pytest.raises(CodecError) as err:
        decode_node_devices(text)
    if message != "legacy":
        assert message in str(err.value)


def test_decode_json_error_names_the_device_and_field() -> None:
    with pytest.raises(CodecError) as err:
        decode_node_devices('[{"id":"a"},{"count":"10"}]')
    assert str(err.value) == (
        "node register annotation device 1: json: cannot unmarshal string into Go struct field DeviceInfo.count of type int32"
    )


def test_decode_json_lone_surrogates_become_replacement_chars() -> None:
    (device,) = decode_node_devices('[{"id":"a\\ud800b","type":"\\ud83d\\ude00"}]')
    assert device.uuid == "a\ufffdb" and device.type == "\U0001f600"


def test_decode_json_deep_custominfo() -> None:
    deep = "[" * 500 + "]" * 500
    assert decode_node_devices(f'[{{"id":"a","custominfo":{{"x":{deep}}}}}]')[0].uuid == "a"


def test_decode_json_forced_on_legacy_text() -> None:
    with pytest.raises(CodecError, match="invalid JSON"):
        decode_node_devices_json(LEGACY_P4)


@pytest.mark.parametrize(
    ("device", "what"),
    [
        (DeviceInfo("a", -1, 1, 1, 1, "t"), "index -1"),
        (DeviceInfo("a", 0, 2**31, 1, 1, "t"), "count"),
        (DeviceInfo("a", 0, 1, -(2**31) - 1, 1, "t"), "devmem"),
        (DeviceInfo("a", 0, 1, 1, 2**31, "t"), "devcore"),
        (DeviceInfo("a", 0, 1, 1, 1, "t", numa=2**63), "numa"),
        (DeviceInfo("a", 0, 1, 1, 1, "t", mig_profiles=(MigProfile("p", 1, 1, -1),)), "sliceCount"),
        (
            DeviceInfo(
                "a",
                0,
                1,
                1,
                1,
                "t",
                mig_profiles=(MigProfile("p", 1, 1, 1, (MigPlacement(0, 2**32),)),),
            ),
            "size",
        ),
    ],
)
def test_encode_node_devices_rejects_out_of_range(device: DeviceInfo, what: str) -> None:
    with pytest.raises(CodecError, match=what):
        encode_node_devices([device])


# --- node register, legacy ----------------------------------------------------------------


def test_legacy_spec_example() -> None:
    assert decode_node_devices(LEGACY_P4) == (P4_DEVICE,)
    assert decode_node_devices_legacy(LEGACY_P4) == (P4_DEVICE,)
    assert encode_node_devices_legacy([P4_DEVICE]) == LEGACY_P4


def test_legacy_seven_fields_and_several_devices() -> None:
    text = "GPU-a,10,1000,100,T4,0,false:GPU-b,5,2000,50,T4,1,1,2,mig:"
    assert decode_node_devices(text) == (
        DeviceInfo("GPU-a", 0, 10, 1000, 100, "T4", 0, "hami-core", False),
        DeviceInfo("GPU-b", 2, 5, 2000, 50, "T4", 1, "mig", True),
    )


def test_legacy_empty_segments_skipped_and_no_trailing_colon_needed() -> None:
    assert len(decode_node_devices("::GPU-a,1,1,1,T,0,t::GPU-b,1,1,1,T,0,T")) == 2


def test_legacy_encode_nine_fields() -> None:
    devices = [
        DeviceInfo("GPU-a", 0, 10, 1000, 100, "T4", 0, "hami-core", False),
        DeviceInfo("GPU-b", 7, 5, 2, 3, "X", -1, "", True),
    ]
    assert (
        encode_node_devices_legacy(devices)
        == "GPU-a,10,1000,100,T4,0,false,0,hami-core:GPU-b,5,2,3,X,-1,true,7,:"
    )
    assert encode_node_devices_legacy([]) == ""


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "node annotation missing device separator"),
        ("GPU-a,1,1,1,T,0,true", "node annotation missing device separator"),
        (":", "no gpu found on node"),
        ("GPU-a:", 'malformed node annotation segment: "GPU-a"'),
        ('a"b\n:', 'malformed node annotation segment: "a\\"b\\n"'),
        ("a,1,1,1,T,0:", "unexpected field count 6 in node annotation"),
        ("a,1,1,1,T,0,true,1:", "unexpected field count 8 in node annotation"),
        ("a,1,1,1,T,0,true,1,m,x:", "unexpected field count 10 in node annotation"),
        ("a,x,1,1,T,0,true:", 'invalid count field: strconv.ParseInt: parsing "x": invalid syntax'),
        (
            "a,2147483648,1,1,T,0,true:",
            'invalid count field: strconv.ParseInt: parsing "2147483648": value out of range',
        ),
        (
            "a,1, 1,1,T,0,true:",
            'invalid memory field: strconv.ParseInt: parsing " 1": invalid syntax',
        ),
        (
            "a,1,1,1_0,T,0,true:",
            'invalid core field: strconv.ParseInt: parsing "1_0": invalid syntax',
        ),
        (
            "a,1,1,1,T,0,yes:",
            'invalid health field: strconv.ParseBool: parsing "yes": invalid syntax',
        ),
        (
            "a,1,1,1,T,zero,true:",
            'invalid numa field: strconv.Atoi: parsing "zero": invalid syntax',
        ),
        (
            "a,1,1,1,T,0,true,one,m:",
            'invalid index field: strconv.Atoi: parsing "one": invalid syntax',
        ),
        ("a,1,1,1,T,0,true,-1,m:", "index field must not be negative: -1"),
        ("a,1,1,1,T,0,true,9223372036854775808,m:", "value out of range"),
    ],
)
def test_legacy_errors(text: str, message: str) -> None:
    with pytest.raises(CodecError) as err:
        decode_node_devices_legacy(text)
    assert str(err.value) == message or message in str(err.value)


def test_legacy_error_texts_exact() -> None:
    with pytest.raises(CodecError) as err:
        decode_node_devices("a,1,1,1,T,0:")
    assert str(err.value) == "unexpected field count 6 in node annotation"


@pytest.mark.parametrize(
    "device",
    [
        DeviceInfo("GPU,a", 0, 1, 1, 1, "T"),
        DeviceInfo("GPU-a", 0, 1, 1, 1, "T:4"),
        DeviceInfo("GPU-a", 0, 1, 1, 1, "T", mode="a,b"),
        DeviceInfo("GPU-a", -1, 1, 1, 1, "T"),
        DeviceInfo("GPU-a", 0, 1, 1, 1, "T", mig_profiles=(PROFILE,)),
    ],
)
def test_legacy_encode_rejects_unrepresentable(device: DeviceInfo) -> None:
    with pytest.raises(CodecError):
        encode_node_devices_legacy([device])


# --- pod device string ----------------------------------------------------------------------


def test_pod_spec_example() -> None:
    text = "GPU-0fc3,NVIDIA,3000,0:;GPU-0fc3,NVIDIA,5000,0:;"
    pod = decode_pod_devices(text)
    assert pod == (
        (ContainerDevice("GPU-0fc3", "NVIDIA", 3000, 0),),
        (ContainerDevice("GPU-0fc3", "NVIDIA", 5000, 0),),
    )
    assert encode_pod_devices(pod) == text


def test_field_case_b14_five_containers() -> None:
    pod = decode_pod_devices(B14)
    assert len(pod) == 5
    assert pod[1] == (ContainerDevice("GPU-aaaa-0", "NVIDIA", 1000, 0),)
    assert [len(c) for c in pod] == [0, 1, 0, 0, 0]
    assert encode_pod_devices(pod) == B14


@pytest.mark.parametrize(
    ("text", "shape"),
    [
        ("", []),
        (";", [0]),
        (";;", [0, 0]),
        ("a,N,1,2:b,N,3,4:;", [2]),
        ("a,N,1,2:", [1]),  # no terminating ';': still one container
        ("a,N,1,2", [1]),  # nor ':'
        ("junk:a,N,1,2:::;x;", [1, 0]),  # pieces without ',' ignored
        ("a,N,1,2,extra,fields:;", [1]),
        (",,0,0:;", [1]),  # empty UUID and type accepted as in HAMi v2.10
        ("a,N,-5,-1:;", [1]),  # negative values accepted as in HAMi v2.10
    ],
)
def test_pod_decode_shapes(text: str, shape: list[int]) -> None:
    assert [len(c) for c in decode_pod_devices(text)] == shape


def test_pod_decode_values() -> None:
    assert decode_pod_devices("a,N,1,2,x:") == ((ContainerDevice("a", "N", 1, 2),),)
    assert decode_pod_devices("a,N,-5,+7:;") == ((ContainerDevice("a", "N", -5, 7),),)


def test_empty_pod_encodes_empty() -> None:
    assert encode_pod_devices(()) == ""
    assert encode_pod_devices(((),)) == ";"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "a,N,1:;",
            "pod annotation format error, missing fields, do not use nodeName in task spec",
        ),
        ("a,N:;", "pod annotation format error, missing fields, do not use nodeName in task spec"),
        ("a,N,x,0:;", 'invalid memory field: strconv.ParseInt: parsing "x": invalid syntax'),
        ("a,N,,0:;", 'invalid memory field: strconv.ParseInt: parsing "": invalid syntax'),
        (
            "a,N,2147483648,0:;",
            'invalid memory field: strconv.ParseInt: parsing "2147483648": value out of range',
        ),
        ("a,N,1,1.5:;", 'invalid core field: strconv.ParseInt: parsing "1.5": invalid syntax'),
        (
            "a,N,1,-2147483649:;",
            'invalid core field: strconv.ParseInt: parsing "-2147483649": value out of range',
        ),
    ],
)
def test_pod_decode_errors(text: str, message: str) -> None:
    with pytest.raises(CodecError) as err:
        decode_pod_devices(text)
    assert str(err.value) == message


@pytest.mark.parametrize(
    "device",
    [
        ContainerDevice("a,b", "NVIDIA", 1, 0),
        ContainerDevice("a:b", "NVIDIA", 1, 0),
        ContainerDevice("a;b", "NVIDIA", 1, 0),
        ContainerDevice("a", "NV;", 1, 0),
        ContainerDevice("a", "NVIDIA", 2**31, 0),
        ContainerDevice("a", "NVIDIA", 0, -(2**31) - 1),
    ],
)
def test_pod_encode_rejects_unrepresentable(device: ContainerDevice) -> None:
    with pytest.raises(CodecError):
        encode_pod_devices(((device,),))


# --- node lock ------------------------------------------------------------------------------

T0 = datetime(2026, 8, 21, 6, 20, 39, tzinfo=UTC)
CST = timezone(timedelta(hours=8))


def test_node_lock_encode() -> None:
    assert encode_node_lock(T0, "team-x", "worker-123") == "2026-08-21T06:20:39Z,team-x,worker-123"
    assert encode_node_lock(T0.astimezone(CST), "ns", "p") == "2026-08-21T14:20:39+08:00,ns,p"
    minus = timezone(-timedelta(hours=3, minutes=30))
    assert encode_node_lock(T0.astimezone(minus), "ns", "p") == "2026-08-21T02:50:39-03:30,ns,p"
    assert encode_node_lock(T0.replace(microsecond=999999), "ns", "p").startswith(
        "2026-08-21T06:20:39Z"
    )
    assert encode_node_lock(T0.replace(year=5), "", "").startswith("0005-08-21T")


def test_node_lock_encode_zero_offset_is_z_and_sub_minute_offsets_truncate() -> None:
    assert (
        encode_node_lock(T0.replace(tzinfo=timezone(timedelta(0), "GMT")), "a", "b")
        .split(",")[0]
        .endswith("Z")
    )
    odd = timezone(-timedelta(seconds=30))
    assert (
        encode_node_lock(datetime(2026, 1, 1, tzinfo=odd), "a", "b")
        == "2026-01-01T00:00:00+00:00,a,b"
    )


def test_node_lock_encode_errors() -> None:
    with pytest.raises(CodecError, match="timezone-aware"):
        encode_node_lock(datetime(2026, 1, 1), "a", "b")
    with pytest.raises(CodecError, match="separator"):
        encode_node_lock(T0, "a,b", "c")
    with pytest.raises(CodecError, match="separator"):
        encode_node_lock(T0, "a", "b,c")


def test_node_lock_decode() -> None:
    assert decode_node_lock("2026-08-21T06:20:39Z,team-x,worker-123") == NodeLock(
        T0, "team-x", "worker-123"
    )
    lock = decode_node_lock("2026-08-21T14:20:39+08:00,ns,p")
    assert lock.time == T0 and lock.time.utcoffset() == timedelta(hours=8)
    assert decode_node_lock("2026-08-21T06:20:39Z") == NodeLock(T0, "", "")  # legacy
    assert decode_node_lock("2026-08-21T06:20:39.123456789Z,,").time == T0.replace(
        microsecond=123456
    )
    assert decode_node_lock("2026-08-21T6:20:39Z,a,b").time == T0  # Go accepts a 1-digit hour


def test_field_case_b01_owner_is_exact() -> None:
    lock = decode_node_lock("2026-08-21T06:20:39Z,team-x,worker-123")
    assert lock.is_owned_by("team-x", "worker-123")
    assert not lock.is_owned_by("team-x", "worker")
    assert not lock.is_owned_by("team", "x,worker-123")
    assert not lock.is_owned_by("team-x", "worker-1234")
    assert not decode_node_lock("2026-08-21T06:20:39Z").is_owned_by("", "")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("a,b", "malformed lock annotation: expected 3 parts, got 2 from a,b"),
        (
            "2026-08-21T06:20:39Z,a,b,c",
            "malformed lock annotation: expected 3 parts, got 4 from 2026-08-21T06:20:39Z,a,b,c",
        ),
        ("", "not RFC3339"),
        ("garbage", "not RFC3339"),
        ("2026-08-21 06:20:39,a,b", "not RFC3339"),
        ("2026-08-21T06:20:39z,a,b", "not RFC3339"),
        ("2026-08-21T06:20:39,a,b", "not RFC3339"),
        ("2026-02-30T06:20:39Z,a,b", "not RFC3339"),
        ("2026-08-21T24:00:00Z,a,b", "not RFC3339"),
        ("2026-08-21T06:20:60Z,a,b", "not RFC3339"),
        ("2026-08-21T06:20:39+24:00,a,b", "not RFC3339"),
        ("0000-01-01T00:00:00Z", "not RFC3339"),
    ],
)
def test_node_lock_decode_errors(value: str, message: str) -> None:
    with pytest.raises(CodecError) as err:
        decode_node_lock(value)
    assert message in str(err.value)


# --- handshake --------------------------------------------------------------------------------


def test_handshake() -> None:
    assert (
        encode_handshake(datetime(2026, 8, 21, 6, 20, 39, 500)) == "Requesting_2026-08-21 06:20:39"
    )
    assert encode_handshake(T0.astimezone(CST)) == "Requesting_2026-08-21 14:20:39"
    assert decode_handshake("Requesting_2026-08-21 06:20:39") == Handshake(
        "Requesting", datetime(2026, 8, 21, 6, 20, 39)
    )
    # field case B20: a Deleted_ mark keeps its timestamp so its age can be checked
    assert decode_handshake("Deleted_2026-08-21 06:20:39") == Handshake(
        "Deleted", datetime(2026, 8, 21, 6, 20, 39)
    )
    assert decode_handshake("Deleted_not-a-time") == Handshake("Deleted", None)
    assert decode_handshake("Requesting") == Handshake("Requesting", None)
    assert decode_handshake("Requesting_garbage") == Handshake("Requesting", None)
    assert decode_handshake("Requesting_2026-13-01 00:00:00") == Handshake("Requesting", None)
    assert decode_handshake("") == Handshake("", None)
    assert decode_handshake("Requesting_2026-08-21 6:20:39.5").time == datetime(
        2026, 8, 21, 6, 20, 39, 500000
    )
    assert is_handshake_requesting("xRequestingx") and not is_handshake_requesting("Reported_2026")


# --- node pair scores --------------------------------------------------------------------------


def test_node_scores() -> None:
    text = '[{"uuid":"GPU-a","score":{"GPU-b":200,"GPU-c":100}},{"uuid":"GPU-b","score":{"GPU-a":200}}]'
    assert decode_node_scores(text) == {
        "GPU-a": {"GPU-b": 200, "GPU-c": 100},
        "GPU-b": {"GPU-a": 200},
    }
    assert decode_node_scores("null") == {} and decode_node_scores("[]") == {}
    first = '[{"uuid":"a","score":{"b":1}},{"uuid":"a","score":{"b":2}}]'
    assert decode_node_scores(first) == {"a": {"b": 1}}  # HAMi takes the first match
    assert decode_node_scores('[{"UUID":"a","Score":{"B":1},"score":{"c":null}}]') == {
        "a": {"B": 1, "c": 0}
    }
    assert decode_node_scores('[{"uuid":"a"},null]') == {"a": {}, "": {}}


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{}",
        '[{"uuid":1}]',
        '[{"score":[]}]',
        '[{"score":{"a":"1"}}]',
        '[{"score":{"a":1.5}}]',
        '[{"score":{"a":9223372036854775808}}]',
        "[1]",
    ],
)
def test_node_scores_errors(text: str) -> None:
    with pytest.raises(CodecError):
        decode_node_scores(text)


# --- scoring weights -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "weights"),
    [
        ("slot=1,core=1,memory=3", ScoringWeights(1, 1, 3)),
        (" memory = 2 , slot=0,core=5 ", ScoringWeights(0, 5, 2)),
        ("slot=+1,core=0,memory=0", ScoringWeights(1, 0, 0)),
        ("slot=9223372036854775807,core=0,memory=0", ScoringWeights(2**63 - 1, 0, 0)),
        ("slot=1=2,core=1,memory=1", None),
    ],
)
def test_scoring_weights(value: str, weights: ScoringWeights | None) -> None:
    if weights is None:
        with pytest.raises(CodecError, match='"slot" weight must be an integer'):
            parse_scoring_weights(value)
    else:
        assert parse_scoring_weights(value) == weights


def test_scoring_weights_default() -> None:
    assert ScoringWeights() == ScoringWeights(1, 1, 1)


PREFIX = 'invalid hami.io/device-scoring-weights annotation "{}": '


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("", "expected slot, core, and memory weights"),
        ("slot=1,core=1", "expected slot, core, and memory weights"),
        ("slot=1,core=1,memory=1,", "expected slot, core, and memory weights"),
        ("slot=1,core,memory=1", "expected key=value entries"),
        ("slot=1,,memory=1", "expected key=value entries"),
        ("slot=1,slot=2,memory=1", 'duplicate "slot" weight'),
        ("slot=1, slot =x,memory=1", 'duplicate "slot" weight'),
        ("slot=x,core=1,memory=1", '"slot" weight must be an integer'),
        ("slot=1.5,core=1,memory=1", '"slot" weight must be an integer'),
        ("slot=,core=1,memory=1", '"slot" weight must be an integer'),
        ("slot=9223372036854775808,core=1,memory=1", '"slot" weight must be an integer'),
        ("slot=1,core=-1,memory=1", '"core" weight must not be negative'),
        ("gpu=1,core=1,memory=1", 'unknown weight "gpu"'),
        ("Slot=1,core=1,memory=1", 'unknown weight "Slot"'),
        ("gpu=-1,core=1,memory=1", '"gpu" weight must not be negative'),
        ("slot=0,core=0,memory=0", "at least one weight must be positive"),
    ],
)
def test_scoring_weights_errors(value: str, reason: str) -> None:
    with pytest.raises(CodecError) as err:
        parse_scoring_weights(value)
    assert str(err.value) == PREFIX.format(value) + reason


# --- MIG allocations -------------------------------------------------------------------------

MIG_A = MigAllocation(0, 0, "GPU-a", "1g.5gb", MigPlacement(6, 1))
MIG_A_JSON = '{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb","placement":{"start":6,"size":1}}'


def test_mig_allocations_encode() -> None:
    assert encode_mig_allocations([MIG_A]) == f"[{MIG_A_JSON}]"
    ready = MigAllocation(
        1, 2, "GPU-a", "3g.20gb", MigPlacement(4, 4), MigRuntimeIdentity("MIG-x", 0, 0)
    )
    assert encode_mig_allocations([MIG_A, ready]) == (
        f"[{MIG_A_JSON},"
        '{"containerIndex":1,"deviceIndex":2,"gpuUUID":"GPU-a","profile":"3g.20gb","placement":{"start":4,"size":4},'
        '"migUUID":"MIG-x","gpuInstanceID":0,"computeInstanceID":0}]'
    )
    assert encode_mig_allocations([]) == ""


def test_mig_allocations_decode() -> None:
    assert decode_mig_allocations(f"[{MIG_A_JSON}]") == (MIG_A,)
    assert (
        decode_mig_allocations("") == ()
        and decode_mig_allocations("null") == ()
        and decode_mig_allocations("[]") == ()
    )
    text = '[{"ContainerIndex":0,"deviceindex":0,"GPUUUID":"GPU-a","profile":"1g.5gb","placement":{"start":6,"size":1},"migUUID":"","gpuInstanceID":null,"x":1}]'
    assert decode_mig_allocations(text) == (MIG_A,)
    runtime = '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"g","profile":"p","placement":{"size":1},"migUUID":"m","gpuInstanceID":3,"computeInstanceID":4}]'
    assert decode_mig_allocations(runtime)[0].runtime == MigRuntimeIdentity("m", 3, 4)


def _mig(**fields: object) -> str:
    base: dict[str, object] = {
        "containerIndex": 0,
        "deviceIndex": 0,
        "gpuUUID": "g",
        "profile": "p",
        "placement": {"start": 0, "size": 1},
    }
    base.update(fields)
    return json.dumps([{k: v for k, v in base.items() if v != "DROP"}])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (_mig(containerIndex=-1), "MIG allocation 0 is incomplete"),
        (_mig(deviceIndex=-1), "MIG allocation 0 is incomplete"),
        (_mig(gpuUUID=""), "MIG allocation 0 is incomplete"),
        (_mig(profile="DROP"), "MIG allocation 0 is incomplete"),
        (_mig(placement={"start": 1, "size": 0}), "MIG allocation 0 is incomplete"),
        (_mig(placement="DROP"), "MIG allocation 0 is incomplete"),
        ("[null]", "MIG allocation 0 is incomplete"),
        (_mig(migUUID="m"), "MIG allocation 0 has partial runtime identity"),
        (_mig(gpuInstanceID=0), "MIG allocation 0 has partial runtime identity"),
        (_mig(migUUID="m", computeInstanceID=1), "MIG allocation 0 has partial runtime identity"),
        (
            _mig(gpuInstanceID=0, computeInstanceID=0),
            "MIG allocation 0 has partial runtime identity",
        ),
        (_mig(gpuInstanceID=-1), "of type uint32"),
        (_mig(placement={"start": -1, "size": 1}), "of type uint32"),
        (_mig(containerIndex="0"), "of type int"),
        ("{}", "cannot unmarshal object"),
        ("[", "invalid JSON"),
    ],
)
def test_mig_allocations_decode_errors(text: str, message: str) -> None:
    with pytest.raises(CodecError) as err:
        decode_mig_allocations(text)
    assert message in str(err.value)


def test_mig_allocations_duplicate() -> None:
    one = json.loads(_mig())[0]
    with pytest.raises(CodecError, match="^duplicate MIG allocation for container 0 device 0$"):
        decode_mig_allocations(json.dumps([one, one]))
    with pytest.raises(CodecError, match="MIG allocation 1 is incomplete"):
        decode_mig_allocations(json.dumps([one, {**one, "profile": ""}]))


@pytest.mark.parametrize(
    "allocations",
    [
        [MIG_A, MIG_A],
        [MigAllocation(0, 0, "", "p", MigPlacement(0, 1))],
        [MigAllocation(0, 0, "g", "p", MigPlacement(0, 0))],
        [MigAllocation(0, 0, "g", "p", MigPlacement(0, 1), MigRuntimeIdentity("", 1, 1))],
        [MigAllocation(0, 0, "g", "p", MigPlacement(0, 1), MigRuntimeIdentity("m", -1, 1))],
        [MigAllocation(0, 0, "g", "p", MigPlacement(2**32, 1))],
    ],
)
def test_mig_allocations_encode_errors(allocations: list[MigAllocation]) -> None:
    with pytest.raises(CodecError):
        encode_mig_allocations(allocations)


# --- Go helpers ------------------------------------------------------------------------------


def test_go_helpers() -> None:
    assert go_quote('a"\\\n\t\x00é\u200b') == '"a\\"\\\\\\n\\t\\x00é\\u200b"'
    assert parse_go_int("+12") == 12 and parse_go_int("-0") == 0
    assert parse_go_bool("T") and not parse_go_bool("False")
    for bad in ("", "+", "1 ", " 1", "0x10", "1_000", "١"):
        with pytest.raises(CodecError, match="invalid syntax"):
            parse_go_int(bad)
    with pytest.raises(CodecError, match="value out of range"):
        parse_go_int("9" * 100)


def test_codec_error_is_value_error() -> None:
    assert issubclass(CodecError, ValueError)


# --- properties ------------------------------------------------------------------------------

INT32 = st.integers(-(2**31), 2**31 - 1)
UINT32 = st.integers(0, 2**32 - 1)
TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)


def _no(separators: str) -> st.SearchStrategy[str]:
    return st.text(
        st.characters(exclude_categories=("Cs",), exclude_characters=separators), max_size=12
    )


PLACEMENTS = st.builds(MigPlacement, UINT32, UINT32)
PROFILES = st.builds(
    MigProfile, TEXT, INT32, INT32, UINT32, st.lists(PLACEMENTS, max_size=3).map(tuple)
)
DEVICES = st.builds(
    DeviceInfo,
    uuid=TEXT,
    index=st.integers(0, 2**64 - 1),
    split_count=INT32,
    memory_mib=INT32,
    cores_percent=INT32,
    type=TEXT,
    numa=st.integers(-(2**63), 2**63 - 1),
    mode=TEXT,
    health=st.booleans(),
    mig_profiles=st.lists(PROFILES, max_size=2).map(tuple),
)
LEGACY_DEVICES = st.builds(
    DeviceInfo,
    uuid=_no(",:"),
    index=st.integers(0, 2**63 - 1),
    split_count=INT32,
    memory_mib=INT32,
    cores_percent=INT32,
    type=_no(",:"),
    numa=st.integers(-(2**63), 2**63 - 1),
    mode=_no(",:"),
    health=st.booleans(),
)
CONTAINER_DEVICES = st.builds(ContainerDevice, _no(",:;"), _no(",:;"), INT32, INT32)
PODS = st.lists(st.lists(CONTAINER_DEVICES, max_size=3).map(tuple), max_size=6).map(tuple)


@given(st.lists(DEVICES, min_size=1, max_size=4))
def test_node_devices_json_round_trip(devices: list[DeviceInfo]) -> None:
    text = encode_node_devices(devices)
    assert decode_node_devices(text) == tuple(devices)
    assert isinstance(json.loads(text), list)  # valid JSON


@given(st.lists(LEGACY_DEVICES, min_size=1, max_size=4))
def test_node_devices_legacy_round_trip(devices: list[DeviceInfo]) -> None:
    assert decode_node_devices_legacy(encode_node_devices_legacy(devices)) == tuple(devices)


@given(PODS)
def test_pod_devices_round_trip(pod: tuple[tuple[ContainerDevice, ...], ...]) -> None:
    text = encode_pod_devices(pod)
    assert decode_pod_devices(text) == pod
    assert encode_pod_devices(decode_pod_devices(text)) == text


@given(PODS)
def test_served_pod_devices_empties_every_container(pod: tuple[tuple[ContainerDevice, ...], ...]
                                                    ) -> None:
    """What HAMi's device plugin leaves in ``-to-allocate`` once the pod is served: one
    empty entry per container, the container count unchanged."""
    served = served_pod_devices(encode_pod_devices(pod))
    assert decode_pod_devices(served) == tuple(() for _ in pod)
    assert served == ";" * len(pod)


def test_served_pod_devices_of_hami_strings() -> None:
    assert served_pod_devices(f"{P4},NVIDIA,1000,0:;;") == ";;"
    assert served_pod_devices(f";{P4},NVIDIA,1000,0:;;;;") == ";;;;;"
    assert served_pod_devices("") == ""
    with pytest.raises(CodecError):
        served_pod_devices(f"{P4},NVIDIA,x,0:;")


@given(
    st.datetimes(
        min_value=datetime(1, 1, 2),
        max_value=datetime(9999, 12, 30),
        timezones=st.builds(lambda m: timezone(timedelta(minutes=m)), st.integers(-1439, 1439)),
    ),
    _no(","),
    _no(","),
)
def test_node_lock_round_trip(now: datetime, namespace: str, name: str) -> None:
    now = now.replace(microsecond=0)
    lock = decode_node_lock(encode_node_lock(now, namespace, name))
    assert lock == NodeLock(now, namespace, name)
    assert lock.time.utcoffset() == now.utcoffset()


@given(st.datetimes())
def test_handshake_round_trip(now: datetime) -> None:
    assert decode_handshake(encode_handshake(now)) == Handshake(
        "Requesting", now.replace(microsecond=0)
    )


@given(
    st.permutations(["slot", "core", "memory"]),
    st.lists(st.integers(0, 2**63 - 1), min_size=3, max_size=3),
    st.sampled_from(["", " ", "\t"]),
)
def test_scoring_weights_property(keys: list[str], values: list[int], pad: str) -> None:
    text = ",".join(f"{pad}{k}{pad}={pad}{v}{pad}" for k, v in zip(keys, values, strict=True))
    if not any(values):
        with pytest.raises(CodecError):
            parse_scoring_weights(text)
    else:
        assert parse_scoring_weights(text) == ScoringWeights(**dict(zip(keys, values, strict=True)))


MIG_ALLOCATIONS = st.lists(
    st.builds(
        MigAllocation,
        st.integers(0, 2**63 - 1),
        st.integers(0, 2**63 - 1),
        TEXT.filter(bool),
        TEXT.filter(bool),
        st.builds(MigPlacement, UINT32, st.integers(1, 2**32 - 1)),
        st.none() | st.builds(MigRuntimeIdentity, TEXT.filter(bool), UINT32, UINT32),
    ),
    max_size=4,
    unique_by=lambda a: (a.container_index, a.device_index),
)


@given(MIG_ALLOCATIONS)
def test_mig_allocations_round_trip(allocations: list[MigAllocation]) -> None:
    assert decode_mig_allocations(encode_mig_allocations(allocations)) == tuple(allocations)


@given(
    st.dictionaries(
        TEXT, st.dictionaries(TEXT, st.integers(-(2**63), 2**63 - 1), max_size=3), max_size=3
    )
)
def test_node_scores_property(scores: dict[str, dict[str, int]]) -> None:
    text = json.dumps([{"uuid": k, "score": v} for k, v in scores.items()], ensure_ascii=False)
    assert decode_node_scores(text) == scores


DECODERS = [
    decode_node_devices,
    decode_node_devices_json,
    decode_node_devices_legacy,
    decode_pod_devices,
    decode_node_lock,
    decode_node_scores,
    parse_scoring_weights,
    decode_mig_allocations,
    decode_handshake,
]
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(max_size=5)
    | st.sampled_from(
        ["id", "count", "health", "migProfiles", "placements", "score", "uuid", "gpuUUID"]
    ),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "id",
                    "index",
                    "count",
                    "devmem",
                    "type",
                    "health",
                    "numa",
                    "mode",
                    "migProfiles",
                    "custominfo",
                    "migtemplate",
                    "name",
                    "sliceCount",
                    "placements",
                    "start",
                    "size",
                    "uuid",
                    "score",
                    "containerIndex",
                    "gpuUUID",
                    "profile",
                    "placement",
                    "migUUID",
                    "gpuInstanceID",
                ]
            )
            | st.text(max_size=4),
            inner,
            max_size=4,
        )
    ),
    max_leaves=12,
)


@pytest.mark.parametrize("decode", DECODERS)
@given(text=st.text())
def test_decoders_raise_only_codec_error_on_text(decode: object, text: str) -> None:
    with contextlib.suppress(CodecError):
        decode(text)  # type: ignore[operator]


@pytest.mark.parametrize("decode", DECODERS)
@given(value=JSON_VALUES)
def test_decoders_raise_only_codec_error_on_json(decode: object, value: object) -> None:
    with contextlib.suppress(CodecError):
        decode(json.dumps([value]))  # type: ignore[operator]
    with contextlib.suppress(CodecError):
        decode(json.dumps(value))  # type: ignore[operator]


@given(
    st.lists(
        st.sampled_from(
            [
                "GPU-a",
                ",",
                ":",
                ";",
                "NVIDIA",
                "1",
                "-1",
                "x",
                "",
                "2147483648",
                "true",
                "hami-core",
                "Z",
                "2026-08-21T06:20:39Z",
            ]
        ),
        max_size=30,
    )
)
def test_decoders_raise_only_codec_error_on_separator_soup(pieces: list[str]) -> None:
    text = "".join(pieces)
    for decode in DECODERS:
        with contextlib.suppress(CodecError):
            decode(text)  # type: ignore[operator]
