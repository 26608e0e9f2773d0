"""Reading a secret from a file only its owner may read: serve's API key file and the RPC key file.
Refused, as ssh refuses a private key, when a regular file's group or others may access it (a pipe
such as /dev/fd/N passes)."""
from __future__ import annotations

import os
import stat


def read_private_file(path: str | os.PathLike, what: str, error: type[Exception], max_bytes: int) -> bytes:
    """The bytes of `path` (at most max_bytes); `error(message)` naming `what` (e.g. "API key file")
    for a missing, unreadable, shared or oversized file."""
    try:
        st = os.stat(path)
        if stat.S_ISREG(st.st_mode) and st.st_mode & 0o077:
            raise error(f"{what} {path} is accessible by others (mode {stat.S_IMODE(st.st_mode):04o}); "
                        f"it must be private: chmod 600 {path}")
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except FileNotFoundError:
        raise error(f"{what} {path} not found") from None
    except IsADirectoryError:
        raise error(f"{what} {path} is a directory") from None
    except OSError as e:
        raise error(f"cannot read {what} {path}: {e.strerror or e}") from None
    if len(data) > max_bytes:
        raise error(f"{what} {path} is larger than {max_bytes} bytes; is it the right file?")
    return data
