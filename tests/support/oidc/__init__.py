"""A real OpenID provider process for sign-in tests: npm's `oidc-provider` on Node.js (provider.js beside this).

`./tandem test` installs it (`npm ci` here); the test fails, not skips, when it is missing.
"""
import json
import shutil
import subprocess
import time
from pathlib import Path

import httpx

from tests.support.processes import free_port

HERE = Path(__file__).resolve().parent
CLIENT_ID = "tandem-portal"
CLIENT_SECRET = "test-client-secret-not-a-secret"


class OidcProvider:
    """`node provider.js` on a free port; `accounts` (id → claims) is rewritten by `set_account`."""

    def __init__(self, tmp: Path, *, redirect_uri: str):
        if shutil.which("node") is None or not (HERE / "node_modules" / "oidc-provider").is_dir():
            raise RuntimeError("The test OpenID provider is not installed: run ./tandem test, which runs "
                               f"`npm ci` in {HERE}.")
        self.port = free_port()
        self.issuer = f"http://127.0.0.1:{self.port}"
        self.accounts_file = tmp / "oidc-accounts.json"
        self.accounts: dict[str, dict] = {}
        self._write()
        self.log = tmp / "oidc-provider.log"
        self.proc = subprocess.Popen(
            ["node", str(HERE / "provider.js"), str(self.port), str(self.accounts_file), CLIENT_ID, CLIENT_SECRET,
             redirect_uri], cwd=HERE, stdout=self.log.open("wb"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while True:
            try:
                self.discovery = httpx.get(self.issuer + "/.well-known/openid-configuration", timeout=1).json()
                break
            except httpx.HTTPError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"oidc-provider did not start: {self.log.read_text()[-2000:]}") from None
                time.sleep(0.1)

    def set_account(self, account_id: str, *, email: str, name: str, groups: list[str],
                    email_verified=True) -> None:
        self.accounts[account_id] = {"email": email, "email_verified": email_verified, "name": name, "groups": groups}
        self._write()

    def remove_account(self, account_id: str) -> None:
        """The person is gone at the provider (disabled, deleted): their session there ends with it."""
        del self.accounts[account_id]
        self._write()

    def _write(self) -> None:
        self.accounts_file.write_text(json.dumps(self.accounts))

    def settings(self) -> dict:
        """Tandem's settings for this provider, from its discovery document (as docs/install.md tells)."""
        d = self.discovery
        return {"OIDC_RP_CLIENT_ID": CLIENT_ID, "OIDC_RP_CLIENT_SECRET": CLIENT_SECRET,
                "OIDC_OP_AUTHORIZATION_ENDPOINT": d["authorization_endpoint"],
                "OIDC_OP_TOKEN_ENDPOINT": d["token_endpoint"], "OIDC_OP_USER_ENDPOINT": d["userinfo_endpoint"],
                "OIDC_OP_JWKS_ENDPOINT": d["jwks_uri"], "TANDEM_OIDC_ISSUER": d["issuer"], "TANDEM_OIDC_ENABLED": True,
                "TANDEM_OIDC_PROVIDER_NAME": "Example Corp"}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
