"""Where the CLI finds its server and token: environment first, then the config file.

``SLUICE_URL`` and ``SLUICE_TOKEN`` override the file; the file is ``$SLUICE_CONFIG`` or
``$XDG_CONFIG_HOME/sluice/config.json`` (``~/.config/sluice/config.json``), written 0600 in a
0700 directory because it holds a token.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

DEFAULT_URL = "http://127.0.0.1:8000"


class ConfigError(Exception):
    """The config file cannot be read (a usage error: exit 2)."""


def config_path(env: Mapping[str, str]) -> Path:
    if env.get("SLUICE_CONFIG"):
        return Path(env["SLUICE_CONFIG"]).expanduser()
    base = env.get("XDG_CONFIG_HOME") or os.path.join(env.get("HOME") or "~", ".config")
    return Path(base).expanduser() / "sluice" / "config.json"


def config_load(path: Path) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except ValueError:
        raise ConfigError(f"{path} is not JSON; fix it or remove it and run `sluice login`")
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a JSON object")
    return data


def config_save(path: Path, data: dict) -> None:
    """Write the file atomically, readable by its owner only (it holds a token)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # the umask or an older file may have left it wider
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=2)
            handle.write("\n")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def normalize_url(url: str) -> str:
    """The portal's root: ``http://host:8000`` (a trailing slash or ``/api/v1`` is dropped)."""
    url = url.strip().rstrip("/")
    if url.endswith("/api/v1"):
        url = url[: -len("/api/v1")]
    if "://" not in url:
        url = "http://" + url
    return url


@dataclass
class Settings:
    url: str
    token: str | None
    username: str | None  # known when the token came from `sluice login`
    path: Path
    stored: dict


def settings_load(env: Mapping[str, str], url: str | None = None) -> Settings:
    path = config_path(env)
    stored = config_load(path)
    stored_url = normalize_url(stored["url"]) if stored.get("url") else None
    chosen = normalize_url(url or env.get("SLUICE_URL") or stored_url or DEFAULT_URL)
    if env.get("SLUICE_TOKEN"):
        return Settings(chosen, env["SLUICE_TOKEN"], None, path, stored)
    # The stored token belongs to the server it was made on: never send it elsewhere.
    if stored.get("token") and stored_url == chosen:
        return Settings(chosen, stored["token"], stored.get("username"), path, stored)
    return Settings(chosen, None, None, path, stored)
