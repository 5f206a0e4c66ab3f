"""Secrets in diagnostics: the mask rule (names and URL userinfo) and MASTER_ADDR validation, as pure
functions checked against Python's own URL and address parsers, and through the real CLI processes."""

from __future__ import annotations

import ipaddress
import json
import socket
import string
import urllib.parse
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurmlaunch.core.distenv import MASKED, check_master_addr, mask, secret_name
from slurmlaunch.core.errors import EnvironmentMappingError
from tests.helpers import clean_env, launch, run_cli, step_env

# Names a site or a user really sets (Slurm's auth plugins, munge, cloud and ML tooling, curl/requests).
SECRET_NAMES = ["SLURM_AUTH_CRED", "MUNGE_CRED", "SLURM_JWT_AUTH", "AWS_SECRET_ACCESS_KEY", "WANDB_API_KEY",
                "HF_TOKEN", "githubtoken", "Db_Password", "PGPASSFILE", "SSHPASS", "SESSION_COOKIE",
                "SSL_CERT_FILE", "GPG_PRIVATE", "AZURE_STORAGE_SIGNATURE", "AuthHeader", "APIKEY"]
PLAIN_NAMES = ["NCCL_DEBUG", "SLURM_JOB_ID", "SLURM_STEP_NODELIST", "CUDA_VISIBLE_DEVICES", "PWD", "OLDPWD",
               "MASTER_ADDR", "GLOO_SOCKET_IFNAME", "OMP_NUM_THREADS", "HOME", "PATH"]


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_credential_like_names_are_masked(name: str) -> None:
    assert secret_name(name) and mask(name, "s3cr3t") == MASKED


@pytest.mark.parametrize("name", PLAIN_NAMES)
def test_ordinary_names_are_shown(name: str) -> None:
    assert not secret_name(name) and mask(name, "value-1") == "value-1"


@pytest.mark.parametrize("value, shown", [
    ("http://u:pw@host", "http://****@host"),
    ("https://ghp_TOKEN@github.com/org/repo.git", "https://****@github.com/org/repo.git"),
    ("postgres://user:p@ss@db:5432/x?sslmode=require", "postgres://****@db:5432/x?sslmode=require"),
    ("http://proxy:3128", "http://proxy:3128"),  # no userinfo: nothing to hide
    ("a http://u:1@x b s3+https://k:s@y/z", "a http://****@x b s3+https://****@y/z"),
    ("mailto:user@example.org", "mailto:user@example.org"),  # not scheme://
    ("http://host/path@not-userinfo", "http://host/path@not-userinfo"),
    ("", ""),
])
def test_url_userinfo_is_masked_in_any_variable(value: str, shown: str) -> None:
    assert mask("HTTPS_PROXY", value) == shown


_USERINFO = st.text(string.ascii_letters + string.digits + "-._~!$&'()*+,;=:%@", min_size=1, max_size=20)
_HOST = st.from_regex(r"[a-z][a-z0-9-]{0,10}(\.[a-z][a-z0-9-]{0,10}){0,2}", fullmatch=True)


@given(scheme=st.sampled_from(["http", "https", "postgres", "redis", "s3+https", "git+ssh"]),
       userinfo=_USERINFO, host=_HOST, port=st.one_of(st.none(), st.integers(1, 65535)),
       path=st.sampled_from(["", "/", "/a/b", "?q=1", "#f", "/x?y@z"]))
def test_masked_url_keeps_what_urllib_sees_but_the_userinfo(scheme: str, userinfo: str, host: str,
                                                             port: int | None, path: str) -> None:
    """Oracle: urllib.parse reads the same host and port from the masked URL as from the original, and
    the masked one's userinfo is exactly ****."""
    url = f"{scheme}://{userinfo}@{host}{'' if port is None else f':{port}'}{path}"
    shown = mask("X", url)
    before, after = urllib.parse.urlsplit(url), urllib.parse.urlsplit(shown)
    assert (after.hostname, after.port, after.path, after.query) == (before.hostname, before.port, before.path,
                                                                     before.query)
    assert after.netloc.rpartition("@")[0] == MASKED


@pytest.mark.parametrize("value", ["node01", "gpu-a100-07.cluster.example.org", "local-node0", "host_1",
                                   "10.0.0.5", "127.0.0.1", "::1", "fe80::1%eth0", "2001:db8::7", "host."])
def test_master_addr_accepts_host_names_and_addresses(value: str) -> None:
    check_master_addr(value)


@pytest.mark.parametrize("value, expected", [
    ("http://u:hunter2@host:29500", "it is a URL; expected a host name or an IP address only ('host')"),
    ("tcp://10.0.0.5:29500", "it is a URL; expected a host name or an IP address only ('10.0.0.5')"),
    ("https://tok@[fe80::1]:1/", "only ('fe80::1')"),
    ("node01:29500", "the port goes in MASTER_PORT"),
    ("[::1]", "no brackets"),
    ("two words", "expected a host name"),
    ("", "expected a host name"),
    ("-leading-dash", "expected a host name"),
    ("a" * 64, "expected a host name"),
])
def test_master_addr_refusals_name_the_variable_and_hide_the_password(value: str, expected: str) -> None:
    with pytest.raises(EnvironmentMappingError) as e:
        check_master_addr(value)
    text = str(e.value)
    assert text.startswith("MASTER_ADDR=") and expected in text and "\n" not in text
    assert "hunter2" not in text and "tok@" not in text


@given(st.ip_addresses())
def test_every_ip_address_is_accepted(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> None:
    """Oracle: Python's ipaddress module writes every address form check_master_addr must take."""
    check_master_addr(str(address))
    if address.version == 6:
        check_master_addr(address.exploded)


@given(st.text(min_size=1, max_size=30))
def test_whatever_is_accepted_is_a_numeric_address_or_a_name_getaddrinfo_takes(value: str) -> None:
    """Oracle: the C library. An accepted value is either an IPv6 address inet_pton parses (with a zone
    made of name characters), or a name made only of characters a host name (or an IPv4 address) holds."""
    try:
        check_master_addr(value)
    except EnvironmentMappingError as e:
        assert "\n" not in str(e)
        return
    name_chars = set(string.ascii_letters + string.digits + "-_.")
    if set(value) <= name_chars:
        return
    address, _, zone = value.partition("%")
    socket.inet_pton(socket.AF_INET6, address)  # raises if check_master_addr took a non-address
    assert set(zone) <= name_chars


@pytest.mark.parametrize("value", ["0:", ":::", "1:2:3", "fe80::1%", "::1%a b", "12345::"])
def test_colons_alone_do_not_make_an_address(value: str) -> None:
    with pytest.raises(EnvironmentMappingError):
        check_master_addr(value)


def test_print_env_masks_credentials_and_url_userinfo(tmp_path: Path) -> None:
    script = tmp_path / "noop.py"
    script.write_text("pass\n")
    secrets = {"SLURM_AUTH_CRED": "cred-abc", "MUNGE_CRED": "munge-def", "SESSION_COOKIE": "cookie-ghi",
               "SSL_CERT_PASSWORD": "cert-jkl", "NCCL_IB_AUTH_TOKEN": "nccl-mno",
               "HTTPS_PROXY": "http://proxyuser:proxy-pqr@proxy.example:3128"}
    env = clean_env(**step_env("localhost", [2], 1, MASTER_ADDR="127.0.0.1"), **secrets, NCCL_DEBUG="INFO")
    p = launch("--print-env", str(script), env=env)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    line = next(ln for ln in err.splitlines() if ln.startswith("slurmlaunch["))
    for value in ("cred-abc", "munge-def", "cookie-ghi", "cert-jkl", "nccl-mno", "proxy-pqr", "proxyuser"):
        assert value not in err
    assert "SLURM_AUTH_CRED='****'" in line and "MUNGE_CRED='****'" in line and "NCCL_DEBUG='INFO'" in line
    assert "HTTPS_PROXY='http://****@proxy.example:3128'" in line


def test_env_command_masks_and_refuses_a_url_master_addr() -> None:
    env = clean_env(**step_env("localhost", [2], 1, MASTER_ADDR="http://admin:hunter2@10.1.2.3:29500"))
    for args in (("env",), ("env", "--json")):
        r = run_cli(*args, env=env)
        assert r.returncode == 2 and r.stdout == ""
        assert r.stderr.count("\n") == 1 and "MASTER_ADDR='http://****@10.1.2.3:29500' is not valid" in r.stderr
        assert "hunter2" not in r.stderr and "admin" not in r.stderr
    good = run_cli("env", "--json", env=clean_env(**step_env("localhost", [2], 1, MASTER_ADDR="10.1.2.3")))
    assert good.returncode == 0 and json.loads(good.stdout)["MASTER_ADDR"] == "10.1.2.3"


def test_launcher_refuses_a_url_master_addr_before_exec(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    script = tmp_path / "touch.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    reasons = tmp_path / "reasons"
    reasons.mkdir()
    env = clean_env(**step_env("localhost", [2], 0, MASTER_ADDR="https://u:hunter2@host"),
                    SLURMLAUNCH_REASONS_DIR=str(reasons))
    p = launch("--no-preflight", str(script), env=env)  # validation is not a preflight check: always on
    out, err = p.communicate(timeout=60)
    assert p.returncode == 65 and not marker.exists()  # 65: the launcher's code for a malformed variable
    assert err.count("\n") == 1 and "MASTER_ADDR='https://****@host'" in err and "hunter2" not in err
    reason = (reasons / "0").read_text()  # the line the batch log will show: masked the same way
    assert "MASTER_ADDR='https://****@host'" in reason and "hunter2" not in reason


def test_config_show_masks_url_userinfo_in_env(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[profiles.p]\nenv = { DB = "postgres://me:pw-xyz@db/x", SLURM_AUTH_CRED = "c-123" }\n')
    env = clean_env(SLURMLAUNCH_CONFIG=str(config), XDG_CONFIG_HOME=str(tmp_path))
    r = run_cli("config", "show", "--profile", "p", env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "pw-xyz" not in r.stdout and "c-123" not in r.stdout and "postgres://****@db/x" in r.stdout


@pytest.mark.parametrize("args, shown", [
    (["--master-addr", "http://me:hunter2@10.0.0.9", "--nnodes", "2", "--node-rank", "1"],
     "--master-addr 'http://****@10.0.0.9' is not valid: it is a URL"),
    (["--rdzv-endpoint", "https://me:hunter2@node7:29500", "--nnodes", "2", "--node-rank", "1"],
     "--rdzv-endpoint host 'https://****@node7' is not valid: it is a URL"),
])
def test_run_refuses_a_url_master_without_echoing_it(args: list[str], shown: str, tmp_path: Path) -> None:
    script = tmp_path / "noop.py"
    script.write_text("pass\n")
    r = run_cli("run", *args, str(script), env=clean_env(), cwd=tmp_path, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert shown in r.stderr and "hunter2" not in r.stderr and "me:" not in r.stderr
