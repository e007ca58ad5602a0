"""The portal's own files under ``var/``: private to the portal's account.

Jobs run as other Unix accounts (see DESIGN §12, "Isolation on the node"); on a single
machine (the demo) they share the host with the portal, so nothing the portal writes may
be readable by them: the SQLite database, the filesystem broker's messages (launches carry
job secrets), logs, the cache, the secret key. Stdlib only: imported by the settings.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

#: Subfolders of var/ other accounts must reach: the demo's node agents keep the job
#: directories there (each agent makes its own work dir traversable, never listable).
TRAVERSABLE = ("agent",)


def secure_var_dir(var_dir: Path) -> None:
    """Make ``var_dir`` and what the portal keeps in it private to this account.

    Files and directories created later by this process are private too (umask 077).
    ``var_dir`` itself is 0711: job accounts may pass through it to ``var/agent/`` but
    cannot list it, and every other entry is 0700 (directories) or 0600 (files), so a
    name guessed is no use either. Run at every start so that an install made by an older
    version (umask 022: a world-readable database) is closed too.
    """
    os.umask(0o077)
    var_dir.mkdir(parents=True, exist_ok=True)
    if not _owned(var_dir):
        return  # not ours (a shared mount, say): leave its modes to its owner
    os.chmod(var_dir, 0o711)
    for entry in var_dir.iterdir():
        if entry.is_symlink() or not _owned(entry):
            continue
        if entry.is_dir():
            mode = 0o711 if entry.name in TRAVERSABLE else 0o700
        else:
            mode = 0o600
        try:
            os.chmod(entry, mode)
        except OSError:
            continue  # vanished meanwhile (a broker message consumed, say)


def persistent_secret_key(path: Path) -> str:
    """The secret key kept in ``path``, made (random, 0600) on first use."""
    try:
        key = path.read_text().strip()
    except FileNotFoundError:
        key = ""
    if len(key) >= 50:
        return key
    key = secrets.token_urlsafe(64)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(key + "\n")
    try:
        os.link(tmp, path)  # never replaces a key another process wrote meanwhile
    except FileExistsError:
        key = path.read_text().strip()
    finally:
        tmp.unlink()
    return key


def _owned(path: Path) -> bool:
    try:
        return path.lstat().st_uid == os.geteuid()
    except OSError:
        return False
