"""Where tandemctl finds its server and token: flags, then TANDEM_URL / TANDEM_TOKEN, then the config file
(~/.config/tandem/config.yaml, `server:` and `token:`), which must be readable by its owner only (0600)."""
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import yaml

from tandemctl.errors import AUTH, USAGE, CliError

DEFAULT_SERVER = "http://127.0.0.1:8800"  # where `./tandem up` serves


def config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "tandem" / "config.yaml"


@dataclass(frozen=True)
class Settings:
    server: str
    token: str | None  # None only for a command that needs none (validate reads the public schema)


def _file_settings(path: Path) -> dict:
    if not path.exists():
        return {}
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise CliError(f"{path} holds a token and is readable by others (mode {mode:04o}); "
                       f"run `chmod 600 {path}`.", AUTH)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise CliError(f"{path} is not YAML: {e}", USAGE) from None
    if not isinstance(data, dict):
        raise CliError(f"{path} must be a mapping with `server` and `token`.", USAGE)
    return data


def settings_load(*, server: str | None, token_required: bool = True) -> Settings:
    """The server and token to use; a missing token is an auth error (exit 3) where the command needs one."""
    env_token = os.environ.get("TANDEM_TOKEN")
    file = {} if env_token and (server or os.environ.get("TANDEM_URL")) else _file_settings(config_path())
    token = env_token or file.get("token")
    if not token and token_required:
        raise CliError(f"No token: set TANDEM_TOKEN or `token:` in {config_path()} (a personal access token from "
                       "the portal's Tokens page).", AUTH)
    url = server or os.environ.get("TANDEM_URL") or file.get("server") or DEFAULT_SERVER
    return Settings(server=str(url).rstrip("/"), token=str(token) if token else None)
