"""Who is calling (`api_keys.py`): the keys file, checked entry by entry, and `Auth`, which
names the client each request is charged to, with keys and without. No server: the HTTP side
(401 bodies, scoped views) is `test_server_bad_requests.py`'s."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from minivtc.serving.api_keys import Auth, Caller, Key, read_keys, weights_of
from minivtc.serving.openai_api import MAX_CLIENT_ID_CHARS, APIError

README = Path(__file__).resolve().parent.parent / "minivtc/serving/README.md"
KEYS = {
    "sk-alice-0001": Key("alice", 2.0),
    "sk-bob-000001": Key("bob"),
    "sk-ops-000001": Key("ops", admin=True),
    "sk-gateway-01": Key("gateway", proxy=True),
}


def readme_keys_file() -> str:
    """The keys file the serving page's "Serving others" writes with a heredoc."""
    found = re.search(r"cat > keys\.json <<'JSON'\n(.*?)\nJSON\n", README.read_text(), re.S)
    assert found, "the serving page no longer shows a keys file"
    return found.group(1)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "keys.json"
    path.write_text(text)
    return path


def test_the_readmes_keys_file_is_read(tmp_path):
    keys = read_keys(write(tmp_path, readme_keys_file()))
    assert sorted((k.client, k.weight, k.admin, k.proxy) for k in keys.values()) == [
        ("alice", 2.0, False, False),
        ("bob", 1.0, False, False),
        ("gateway", 1.0, False, True),
        ("ops", 1.0, True, False),
    ]
    assert weights_of(keys) == {"alice": 2.0, "bob": 1.0, "gateway": 1.0, "ops": 1.0}


def test_one_client_may_hold_several_keys_of_one_weight(tmp_path):
    text = json.dumps(
        {
            "sk-alice-0001": {"client": "a", "weight": 2},
            "sk-alice-0002": {"client": "a", "weight": 2.0},
        }
    )
    assert weights_of(read_keys(write(tmp_path, text))) == {"a": 2.0}


LONG_KEY = "sk-long-enough"
MALFORMED = {
    "short key": ({"sk-abc12": {"client": "a"}, "sk-x": {"client": "b"}}, "shorter than 8"),
    "missing client": ({LONG_KEY: {"weight": 2}}, "'client' must be 1 to 128 characters"),
    "empty client": ({LONG_KEY: {"client": ""}}, "'client' must be 1 to 128 characters"),
    "long client": ({LONG_KEY: {"client": "c" * 129}}, "'client' must be 1 to 128"),
    "client not text": ({LONG_KEY: {"client": 7}}, "'client' must be 1 to 128"),
    "zero weight": ({LONG_KEY: {"client": "a", "weight": 0}}, "'weight' must be a number > 0"),
    "negative weight": ({LONG_KEY: {"client": "a", "weight": -1}}, "'weight' must be a number"),
    "weight as text": ({LONG_KEY: {"client": "a", "weight": "2"}}, "'weight' must be a number"),
    "bool weight": ({LONG_KEY: {"client": "a", "weight": True}}, "'weight' must be a number"),
    "admin as text": ({LONG_KEY: {"client": "a", "admin": "yes"}}, "'admin' must be true or"),
    "admin as 1": ({LONG_KEY: {"client": "a", "admin": 1}}, "'admin' must be true or false"),
    "proxy as text": ({LONG_KEY: {"client": "a", "proxy": "yes"}}, "'proxy' must be true or"),
    "unknown field": ({LONG_KEY: {"client": "a", "role": "x"}}, "want {'client': str"),
    "entry not object": ({LONG_KEY: "alice"}, "want {'client': str"),
    "two weights": (
        {
            "sk-alice-0001": {"client": "a", "weight": 1},
            "sk-alice-0002": {"client": "a", "weight": 3},
        },
        "client 'a' has keys with different weights",
    ),
    "empty": ({}, "want a JSON object of key -> "),
    "a list": ([{"client": "a"}], "want a JSON object of key -> "),
}


@pytest.mark.parametrize("content, why", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_keys_file_is_refused_naming_the_problem(tmp_path, content, why):
    path = write(tmp_path, json.dumps(content))
    with pytest.raises(ValueError, match=re.escape(why)) as e:
        read_keys(path)
    assert str(e.value).startswith(f"{path}: ")  # which file


@pytest.mark.parametrize("text", ['{"sk-long-enough": ', "", "\xff"], ids=["cut", "empty", "bytes"])
def test_a_file_that_is_not_json_is_refused(tmp_path, text):
    path = tmp_path / "keys.json"
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises(ValueError, match="cannot read the API keys"):
        read_keys(path)


def test_a_missing_file_is_refused(tmp_path):
    with pytest.raises(ValueError, match="missing.json: cannot read the API keys"):
        read_keys(tmp_path / "missing.json")


def test_an_infinite_weight_is_refused(tmp_path):
    """A weight of Infinity would divide every charge to 0: that client always goes first."""
    with pytest.raises(ValueError, match="'weight'"):
        read_keys(write(tmp_path, '{"sk-long-enough": {"client": "a", "weight": Infinity}}'))


def test_without_keys_the_request_names_its_client():
    auth = Auth()
    assert auth.caller(None, "hdr", "usr") == Caller("hdr", admin=True)  # the header first
    assert auth.caller(None, None, "usr") == Caller("usr", admin=True)  # then the body's user
    assert auth.caller(None, "", "usr") == Caller("usr", admin=True)  # an empty header is none
    assert auth.caller(None) == Caller("default", admin=True)  # then "default"
    assert auth.caller("Bearer anything", "hdr").client == "hdr"  # a key is not looked at


def unauthorized(auth: Auth, authorization: str | None) -> APIError:
    with pytest.raises(APIError) as e:
        auth.caller(authorization, "hdr", "usr")
    assert e.value.status == 401
    return e.value


def test_with_keys_a_missing_or_unknown_key_is_401():
    auth = Auth(KEYS)
    missing_keys = [None, "", "Bearer", "Bearer    ", "Basic c2stYm9i", "sk-bob-000001"]
    for missing in missing_keys:
        assert unauthorized(auth, missing).code == "missing_api_key", missing
    for unknown in ("Bearer sk-nobody-0001", "Bearer sk-bob-000002", "Bearer SK-BOB-000001"):
        assert unauthorized(auth, unknown).code == "invalid_api_key", unknown


def test_with_keys_the_client_is_the_keys_whatever_the_request_says():
    auth = Auth(KEYS)
    assert auth.caller("Bearer sk-bob-000001", "alice", "ops") == Caller("bob", False, "bob")
    assert auth.caller("bearer  sk-ops-000001 ") == Caller("ops", True, "ops")  # case, spaces
    long = "x" * (MAX_CLIENT_ID_CHARS + 1)
    assert auth.caller("Bearer sk-alice-0001", long).client == "alice"  # ignored, not checked


def test_a_proxy_key_names_the_client_but_no_other_key_can():
    """Trust is the key's: the proxy's requests are charged to the client they name, every
    other key's to the key's own client, whatever they name."""
    auth = Auth(KEYS)
    proxy = "Bearer sk-gateway-01"
    # (the prefix cache stays the key's: the proxy's clients share it, other keys do not)
    assert auth.caller(proxy, "carol", "dave") == Caller("carol", False, "gateway")
    assert auth.caller(proxy, None, "dave") == Caller("dave", False, "gateway")
    assert auth.caller(proxy) == Caller("gateway", False, "gateway")  # none named
    assert auth.caller("Bearer sk-bob-000001", "alice", "ops") == Caller("bob", False, "bob")
    assert unauthorized(auth, None).code == "missing_api_key"


@pytest.mark.parametrize("auth", [Auth(), Auth(KEYS)], ids=["no keys", "a proxy key"])
def test_a_client_id_is_at_most_128_characters(auth):
    key = "Bearer sk-gateway-01"
    ok = "c" * MAX_CLIENT_ID_CHARS
    assert auth.caller(key, ok).client == ok and auth.caller(key, None, ok).client == ok
    for header, user, param in ((ok + "c", None, "X-Client-Id"), (None, ok + "c", "user")):
        with pytest.raises(APIError, match="at most 128 characters; this one has 129") as e:
            auth.caller(key, header, user)
        assert (e.value.status, e.value.param) == (400, param)
