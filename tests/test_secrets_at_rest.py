"""Secrets at rest: the LLM API key is sealed in app.db with a key file (0600) that never goes into a backup;
app.db, originals, backups and restored data dirs are the owner's only; a restore without the key file says which
settings to enter again, with --secret-key the key opens as before; $KBQA_SECRET_KEY gives every process one key."""
from __future__ import annotations

import sqlite3
import stat
from pathlib import Path

from cryptography.fernet import Fernet

from store.secrets import KEY_ENV, KEY_FILE, PREFIX
from tests.shared_data import RULES, needs
from tests.tiny_engine import tiny_engine, tiny_model, wait_idle
from tools.ops import backup as backup_cli
from tools.ops import restore as restore_cli

SECRET = "sk-live-0123456789abcdef"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def stored_key(data: Path) -> str:
    conn = sqlite3.connect(data / "app.db")
    try:
        return conn.execute("SELECT value FROM sys_config WHERE key = 'llm_api_key'").fetchone()[0]
    finally:
        conn.close()


@needs(RULES)
def test_the_llm_key_is_sealed_and_files_are_the_owners(tmp_path, capsys):
    data = tmp_path / "data"
    engine = tiny_engine(data, tiny_model(tmp_path / "tiny"))
    try:
        engine.update_settings({"llm_api_key": SECRET})
        assert engine.upload([(RULES.name, RULES)])[0].ok
        wait_idle(engine)
        raw = stored_key(data)
        assert SECRET not in raw and raw.startswith(f'"{PREFIX}')
        assert SECRET not in (data / "app.db").read_bytes().decode("latin-1")
        assert engine.settings.llm_api_key == SECRET  # opened for the app itself
        assert mode(data / KEY_FILE) == 0o600 and mode(data / "app.db") == 0o600
        uploads = data / "uploads"
        assert mode(uploads) == 0o700 and all(mode(p) == 0o600 for p in uploads.iterdir())
        engine.update_settings({"llm_api_key": SECRET})  # the same value: nothing changes (not a new seal)
        assert stored_key(data) == raw
    finally:
        engine.close()

    dest = tmp_path / "bk"
    assert backup_cli.main([str(dest), "--data-dir", str(data)]) == 0
    assert not (dest / KEY_FILE).exists()  # a backup alone never yields the secret
    assert mode(dest) == 0o700 and all(mode(p) == (0o700 if p.is_dir() else 0o600) for p in dest.rglob("*"))
    assert SECRET not in (dest / "manifest.json").read_text(encoding="utf-8")

    # without the key file: restored, and told which settings to enter again; the app starts without the key
    bare = tmp_path / "restored"
    assert restore_cli.main([str(dest), "--data-dir", str(bare), "--no-check"]) == 0
    assert "llm_api_key" in capsys.readouterr().out
    assert mode(bare) == 0o700 and mode(bare / "app.db") == 0o600
    restored = tiny_engine(bare, tiny_model(tmp_path / "tiny"))
    try:
        assert restored.settings.llm_api_key == ""
        assert restored.health()["secrets_to_reenter"] == ["llm_api_key"]
        restored.update_settings({"llm_api_key": "sk-new-value-9999"})  # entered again: sealed with this key
        assert restored.health()["secrets_to_reenter"] == []
    finally:
        restored.close()

    # with the source's key file: the key opens as before
    keyed = tmp_path / "keyed"
    assert restore_cli.main([str(dest), "--data-dir", str(keyed), "--secret-key", str(data / KEY_FILE),
                             "--no-check"]) == 0
    assert "重新填写" not in capsys.readouterr().out
    again = tiny_engine(keyed, tiny_model(tmp_path / "tiny"))
    try:
        assert again.settings.llm_api_key == SECRET and again.health()["secrets_to_reenter"] == []
    finally:
        again.close()


def test_a_key_from_the_environment_is_used_and_no_key_file_is_made(tmp_path, monkeypatch):
    monkeypatch.setenv(KEY_ENV, Fernet.generate_key().decode())
    data = tmp_path / "data"
    engine = tiny_engine(data, tiny_model(tmp_path / "tiny"))
    try:
        engine.update_settings({"llm_api_key": SECRET})
        assert stored_key(data).startswith(f'"{PREFIX}') and not (data / KEY_FILE).exists()
    finally:
        engine.close()
    monkeypatch.setenv(KEY_ENV, Fernet.generate_key().decode())  # another key: nothing to open
    other = tiny_engine(data, tiny_model(tmp_path / "tiny"))
    try:
        assert other.settings.llm_api_key == "" and other.health()["secrets_to_reenter"] == ["llm_api_key"]
    finally:
        other.close()


def test_a_plain_key_of_an_older_data_dir_is_read_and_sealed_at_its_next_save(tmp_path):
    from store.config_store import ConfigStore
    from store.db import Database

    data = tmp_path / "data"
    db = Database(data / "app.db")
    ConfigStore(db).save({"llm_api_key": SECRET})  # as the app before sealing wrote it
    db.close()
    assert stored_key(data) == f'"{SECRET}"'
    engine = tiny_engine(data, tiny_model(tmp_path / "tiny"))
    try:
        assert engine.settings.llm_api_key == SECRET
        engine.update_settings({"llm_api_key": SECRET + "-rotated"})
        assert stored_key(data).startswith(f'"{PREFIX}')
    finally:
        engine.close()
