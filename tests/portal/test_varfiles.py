"""The portal's files under var/ are private to its account (jobs run as other accounts)."""

import os
import stat

from portal.varfiles import persistent_secret_key, secure_var_dir


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_an_old_world_readable_install_is_closed(tmp_path):
    var = tmp_path / "var"
    (var / "broker" / "node.gpu-01").mkdir(parents=True)
    (var / "logs").mkdir()
    (var / "agent").mkdir()
    (var / "sluice.sqlite3").write_text("db")
    for path in (var, var / "broker", var / "logs", var / "agent"):
        os.chmod(path, 0o755)
    os.chmod(var / "sluice.sqlite3", 0o644)
    old = os.umask(0o022)
    try:
        secure_var_dir(var)
        new_umask = os.umask(0o022)
    finally:
        os.umask(old)

    assert new_umask == 0o077
    assert _mode(var) == 0o711  # traversable to var/agent, not listable
    assert _mode(var / "sluice.sqlite3") == 0o600
    assert _mode(var / "broker") == 0o700
    assert _mode(var / "logs") == 0o700
    assert _mode(var / "agent") == 0o711  # job accounts reach their job directories


def test_a_secret_key_is_made_once_then_read_back(tmp_path):
    path = tmp_path / "secret_key"

    first = persistent_secret_key(path)
    second = persistent_secret_key(path)

    assert first == second and len(first) >= 50
    assert _mode(path) == 0o600
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
