"""Tokens and trusted keys given as arguments (not the environment) to
kiln.backend and kiln.Client, against a real kilnd with --auth_tokens
(issue 18): the right token compiles; a wrong one, or one without the
compile role, runs eagerly with one warning (fallback="eager") or raises
(fallback="error"); an artifact not signed by a trusted key is refused.
See conftest.py for how the tests run.
"""

from __future__ import annotations

import hashlib
import pathlib
import subprocess
import warnings

import pytest
import torch

import kiln
from conftest import KILND, ROOT, Daemon

COMPILE_TOKEN = "py-compile-token-0123456789"
STATS_TOKEN = "py-stats-token-0123456789"


def token_line(token: str, roles: str, name: str) -> str:
    return f"{hashlib.sha256(token.encode()).hexdigest()} {roles} {name}\n"


def public_key(signing_key: pathlib.Path) -> str:
    """kilnd's public key for `signing_key` (created if absent)."""
    out = subprocess.run([KILND, f"--signing_key={signing_key}",
                          "--print_public_key"], check=True,
                         capture_output=True, text=True)
    return out.stdout.strip()


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """kilnd with a token file; yields (daemon, its public key)."""
    tokens = tmp_path_factory.mktemp("tokens") / "tokens"
    tokens.write_text(token_line(COMPILE_TOKEN, "compile", "py") +
                      token_line(STATS_TOKEN, "read-stats", "grafana"))
    d = Daemon([f"--auth_tokens={tokens}"])
    try:
        key = public_key(pathlib.Path(d.dir.name) / "data-signing-key.pem")
        yield d, key
    finally:
        d.stop()


@pytest.fixture(autouse=True)
def _no_environment(monkeypatch):
    """Only the arguments count here."""
    for name in ("KILN_TOKEN", "KILN_TOKEN_FILE", "KILN_TRUSTED_KEYS",
                 "KILN_TLS_CA", "KILN_TLS"):
        monkeypatch.delenv(name, raising=False)


def raised_kiln_error(backend) -> kiln.KilnError:
    """The KilnError that `run(backend)` raises (Dynamo wraps it in
    BackendCompilerFailed)."""
    with pytest.raises(Exception) as info:
        run(backend)
    e = info.value
    while e is not None and not isinstance(e, kiln.KilnError):
        e = getattr(e, "inner_exception", None) or e.__cause__ or e.__context__
    assert e is not None, repr(info.value)
    return e


def model(x):
    return torch.softmax(torch.tanh(x) * 2.0, dim=-1).sum(dim=0)


def run(backend):
    """Runs `model` compiled with `backend`; checks it against eager."""
    x = torch.randn(4, 16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = torch.compile(model, backend=backend)(x)
    torch.testing.assert_close(out, model(x))
    return [str(w.message) for w in caught
            if str(w.message).startswith("kiln:")]


def test_right_token_and_trusted_key_compile(secured):
    daemon, key = secured
    backend = kiln.backend(server=daemon.address, fallback="error",
                           token=COMPILE_TOKEN, trusted_keys=[key])
    assert run(backend) == []
    assert backend.report.compiled_partitions == backend.report.partitions >= 1


def test_token_file_argument(secured, tmp_path):
    daemon, key = secured
    token_file = tmp_path / "token"
    token_file.write_text(COMPILE_TOKEN + "\n")
    backend = kiln.backend(server=daemon.address, fallback="error",
                           token_file=str(token_file), trusted_keys=key)
    assert run(backend) == []
    assert backend.report.compiled_partitions >= 1


@pytest.mark.parametrize("token", [None, "not-a-token"])
def test_missing_or_wrong_token_runs_eagerly_with_one_warning(secured, token):
    daemon, _ = secured
    backend = kiln.backend(server=daemon.address, token=token)
    ours = run(backend)
    assert len(ours) == 1, ours
    assert "refused" in ours[0] and "UNAUTHENTICATED" in ours[0], ours
    assert backend.report.compiled_partitions == 0
    assert any("UNAUTHENTICATED" in r
               for reasons in backend.report.fallbacks.values()
               for r in reasons), backend.report.fallbacks


def test_wrong_token_raises_with_fallback_error(secured):
    daemon, _ = secured
    backend = kiln.backend(server=daemon.address, fallback="error",
                           token="not-a-token")
    assert raised_kiln_error(backend).code_name == "UNAUTHENTICATED"


def test_token_without_the_compile_role_is_denied(secured):
    daemon, _ = secured
    backend = kiln.backend(server=daemon.address, fallback="error",
                           token=STATS_TOKEN)
    e = raised_kiln_error(backend)
    assert e.code_name == "PERMISSION_DENIED"
    assert "needs the role 'compile'" in e.message, e.message


def test_artifact_of_an_untrusted_key_is_refused(secured, tmp_path):
    daemon, _ = secured
    other = public_key(tmp_path / "other-key.pem")  # another kilnd's key
    backend = kiln.backend(server=daemon.address, fallback="error",
                           token=COMPILE_TOKEN, trusted_keys=[other])
    e = raised_kiln_error(backend)
    assert e.code_name == "PERMISSION_DENIED"
    assert "sign" in e.message, e.message
    eager = kiln.backend(server=daemon.address, token=COMPILE_TOKEN,
                         trusted_keys=[other])
    ours = run(eager)
    assert len(ours) == 1 and "PERMISSION_DENIED" in ours[0], ours
    assert eager.report.compiled_partitions == 0


def test_client_takes_token_and_trusted_keys(secured):
    daemon, key = secured
    graph = (ROOT / "examples" / "graphs" / "dynamic_batch.json").read_text()
    x, scale = torch.randn(5, 16), torch.randn(16)
    client = kiln.Client(daemon.address, token=COMPILE_TOKEN,
                         trusted_keys=[key])
    (y,) = client.cpu_executable(graph)(x, scale)
    torch.testing.assert_close(y, torch.tanh(x * scale + 1).mean(dim=1))
    with pytest.raises(kiln.KilnError) as info:
        kiln.Client(daemon.address, token="not-a-token",
                    max_retries=0).cpu_executable(graph)
    assert info.value.code_name == "UNAUTHENTICATED"
    with pytest.raises(kiln.KilnError) as info:
        kiln.Client(daemon.address, trusted_keys="abc")
    assert info.value.code_name == "INVALID_ARGUMENT"
