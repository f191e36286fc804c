"""Who may reach the stack: its directory and auth file are owner-only, and its
Prefect server (started as `gpt2 stack up` starts it, for real) answers only
requests that carry the auth string, and state changes only with a CSRF token;
its UI, served on the stack's port, is told that port and can load."""

from __future__ import annotations

import base64
import re
import stat
from pathlib import Path
from urllib.parse import urljoin

import httpx
import pytest

from cli.stack import prefect_setup, processes, services
from tests.cli.stack.fixtures import clean_env


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_state_dir_is_created_owner_only(tmp_path):
    state_dir = tmp_path / "cache" / "stack"
    services._private_dir(state_dir)
    assert _mode(state_dir) == 0o700


def test_a_looser_state_dir_is_tightened(tmp_path):
    state_dir = tmp_path / "stack"
    state_dir.mkdir(mode=0o755)
    state_dir.chmod(0o755)
    services._private_dir(state_dir)
    assert _mode(state_dir) == 0o700


def test_a_shared_sticky_dir_is_refused_not_locked(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp: others' files live there too
    with pytest.raises(processes.ServiceError, match="shared"):
        services._private_dir(shared)
    assert _mode(shared) == 0o1777


def test_the_auth_string_is_made_once_owner_only_and_kept(tmp_path):
    assert services.read_auth(tmp_path) is None
    auth = services._auth_string(tmp_path)
    user, _, password = auth.partition(":")
    assert user == services.AUTH_USER and len(password) >= 32  # the `user:password` form the UI's login expects
    assert _mode(tmp_path / services.AUTH_FILE) == 0o600
    assert services._auth_string(tmp_path) == auth == services.read_auth(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    assert services._auth_string(other) != auth  # random per stack


def test_an_empty_auth_file_gets_a_string(tmp_path):
    (tmp_path / services.AUTH_FILE).write_text("\n")
    assert services._auth_string(tmp_path).startswith(f"{services.AUTH_USER}:")


def test_a_readable_auth_file_is_tightened(tmp_path):
    auth = services._auth_string(tmp_path)
    (tmp_path / services.AUTH_FILE).chmod(0o644)
    assert services._auth_string(tmp_path) == auth
    assert _mode(tmp_path / services.AUTH_FILE) == 0o600


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The stack's Prefect server alone, started the way `gpt2 stack up` starts it."""
    base = tmp_path_factory.mktemp("stack-server")
    state_dir = base / "state"
    services._private_dir(state_dir)
    auth = services._auth_string(state_dir)
    state = {"processes": []}
    services._start_server(state, state_dir, clean_env(base / "home"), auth)
    rec = state["processes"][0]
    try:
        processes.wait_http(rec, f"{state['prefect_api_url']}/health", services.SERVER_START_S)
        yield {**state, "auth": auth, "state_dir": state_dir}
    finally:
        processes.stop(rec)


def _basic(auth: str) -> dict[str, str]:
    """The header Prefect's clients and the UI send: Basic, base64 of the whole auth string."""
    return {"Authorization": f"Basic {base64.b64encode(auth.encode()).decode()}"}


def _csrf(api: str, auth: str, client_id: str = "gpt2-test") -> dict[str, str]:
    """A CSRF token as Prefect's clients and the UI fetch it."""
    token = httpx.get(f"{api}/csrf-token", params={"client": client_id}, headers=_basic(auth), timeout=30)
    token.raise_for_status()
    return {"Prefect-Csrf-Token": token.json()["token"], "Prefect-Csrf-Client": client_id}


@pytest.mark.e2e
def test_requests_without_the_auth_string_get_401(server):
    api = server["prefect_api_url"]
    assert httpx.get(f"{api}/health", timeout=30).status_code == 200  # liveness probes need no secret
    for headers in ({}, _basic("gpt2:wrong"), {"Authorization": "Bearer nonsense"}):
        assert httpx.get(f"{api}/admin/version", headers=headers, timeout=30).status_code == 401
        assert httpx.get(f"{api}/csrf-token", params={"client": "x"}, headers=headers, timeout=30).status_code == 401
    assert httpx.get(f"{api}/admin/version", headers=_basic(server["auth"]), timeout=30).status_code == 200


@pytest.mark.e2e
def test_a_post_without_a_csrf_token_is_refused(server):
    api, auth = server["prefect_api_url"], server["auth"]
    body, csrf = {"limit": 1}, _csrf(api, auth)
    refused = httpx.post(f"{api}/flow_runs/filter", json=body, headers=_basic(auth), timeout=30)
    assert refused.status_code == 403 and "CSRF" in refused.text
    forged = {"Prefect-Csrf-Token": "forged", "Prefect-Csrf-Client": csrf["Prefect-Csrf-Client"]}
    assert httpx.post(f"{api}/flow_runs/filter", json=body, headers={**_basic(auth), **forged},
                      timeout=30).status_code == 403
    assert httpx.post(f"{api}/flow_runs/filter", json=body, timeout=30).status_code == 403  # CSRF is checked first
    assert httpx.post(f"{api}/flow_runs/filter", json=body, headers=csrf, timeout=30).status_code == 401
    ok = httpx.post(f"{api}/flow_runs/filter", json=body, headers={**_basic(auth), **csrf}, timeout=30)
    assert ok.status_code == 200, ok.text


@pytest.mark.e2e
def test_prefect_clients_get_through_with_the_auth_string_only(server):
    from prefect.client.schemas.actions import VariableCreate
    from prefect.exceptions import PrefectHTTPStatusError

    api, auth = server["prefect_api_url"], server["auth"]
    with prefect_setup.client(api, auth) as c:  # fetches its CSRF token by itself for the POST
        c.create_variable(VariableCreate(name="gpt2_access_test", value="ok"))
        assert c.read_variable_by_name("gpt2_access_test").value == "ok"
    with pytest.raises(PrefectHTTPStatusError, match="401"), prefect_setup.client(api, None) as c:
        c.read_variable_by_name("gpt2_access_test")


@pytest.mark.e2e
def test_the_ui_is_told_the_stacks_own_api_url(server):
    settings = httpx.get(f"{server['prefect_ui_url']}/ui-settings", timeout=30)
    assert settings.status_code == 200
    info = settings.json()
    assert info["api_url"] == server["prefect_api_url"] != "http://127.0.0.1:4200/api"
    assert info["auth"] == "BASIC" and info["csrf_enabled"] is True  # the UI shows its login form


def _assets(html: str) -> list[str]:
    return re.findall(r'<(?:script|link)\b[^>]*\b(?:src|href)="([^"]+\.(?:js|css))"', html)


@pytest.mark.e2e
def test_the_ui_and_its_assets_load_and_its_first_api_calls_pass(server):
    ui, api, auth = server["prefect_ui_url"], server["prefect_api_url"], server["auth"]
    with httpx.Client(follow_redirects=True, timeout=30, headers={"Accept": "text/html"}) as browser:
        page = browser.get(f"{ui}/")
        assert page.status_code == 200 and "<html" in page.text.lower(), page.text[:500]
        assets = _assets(page.text)
        assert any(a.endswith(".js") for a in assets), page.text[:2000]
        for asset in assets:
            fetched = browser.get(urljoin(str(page.url), asset))
            assert fetched.status_code == 200 and fetched.content, asset
    # What the UI calls once logged in: its auth check, then dashboards' filters (POSTs: CSRF token too).
    headers = _basic(auth)
    assert httpx.get(f"{api}/admin/version", headers=headers, timeout=30).status_code == 200
    headers |= _csrf(api, auth, "gpt2-ui-test")
    for path in ("flow_runs/filter", "work_pools/filter", "deployments/filter", "flows/filter"):
        response = httpx.post(f"{api}/{path}", json={}, headers=headers, timeout=30)
        assert response.status_code == 200, (path, response.text)
