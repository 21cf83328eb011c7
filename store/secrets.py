"""Secrets at rest: values the settings mark secret (the LLM API key) are stored encrypted (Fernet: AES-128-CBC with
an HMAC), with a key that never sits in the database.

The key: `$KBQA_SECRET_KEY` (team mode: every app process gets the same one from its environment), else
`<data dir>/secret.key`, created 0600 on first use. Backups copy the database but not the key file, so a backup
alone never yields a secret; a restore without the key file says which secrets to enter again. Stored values
look like `enc:v1:<token>`; an older plain value is read as it is and sealed at its next save.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken

KEY_ENV = "KBQA_SECRET_KEY"
KEY_FILE = "secret.key"
PREFIX = "enc:v1:"
log = logging.getLogger(__name__)


class SecretUnreadable(Exception):
    """A stored secret this key cannot open (restored without the key file, or another key)."""


def private_file(path: Path, data: bytes) -> None:
    """Write `data` to a new file only its owner may read (0600 from the start, not chmod-ed after)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


class SecretBox:
    def __init__(self, key: bytes):
        self._fernet = Fernet(key)

    @classmethod
    def for_data_dir(cls, data_dir: Path, shared: bool = False) -> SecretBox | None:
        """The box of this app's secrets; None (secrets stay as they are) in a team deployment without
        $KBQA_SECRET_KEY, whose processes have data dirs — and so key files — of their own."""
        env = os.environ.get(KEY_ENV, "").strip()
        if env:
            return cls(env.encode())
        if shared:
            log.warning("team deployment without %s: secrets are stored unsealed (docs/deploy.md)", KEY_ENV)
            return None
        path = Path(data_dir) / KEY_FILE
        if not path.exists():
            try:
                private_file(path, Fernet.generate_key())
            except FileExistsError:  # another process of this data dir made it meanwhile
                pass
        return cls(path.read_bytes().strip())

    @staticmethod
    def is_sealed(value: object) -> bool:
        return isinstance(value, str) and value.startswith(PREFIX)

    def seal(self, value: str) -> str:
        if not value or self.is_sealed(value):
            return value
        return PREFIX + self._fernet.encrypt(value.encode()).decode()

    def open(self, value: str) -> str:
        if not self.is_sealed(value):
            return value  # empty, or stored before secrets were sealed
        try:
            return self._fernet.decrypt(value[len(PREFIX):].encode()).decode()
        except InvalidToken:
            raise SecretUnreadable from None
