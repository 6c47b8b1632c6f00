"""Where the watcher listens, and keeping that place private to the user."""

from __future__ import annotations

import ipaddress
import os
import stat
import tempfile
from urllib.parse import urlsplit


class AddressError(ValueError):
    pass


def private_dir() -> str:
    """The per-user directory that holds watcher sockets: created 0700, and refused
    if someone else owns it or can enter it (another user could then connect)."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    if not base or not os.path.isdir(base):
        base = tempfile.gettempdir()
    path = user_dir_in(base)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    check_private_dir(path)
    return path


def user_dir_in(base: str) -> str:
    """This user's commviz directory under `base` (a runtime or temp directory)."""
    return os.path.join(base, f"commviz-{os.getuid()}")


def check_private_dir(path: str) -> None:
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise AddressError(f"{path} is not a directory; remove it so commviz can create its socket directory")
    if st.st_uid != os.getuid():
        raise AddressError(f"{path} belongs to uid {st.st_uid}, not you; remove it or set COMMVIZ_ADDR")
    if st.st_mode & 0o077:
        raise AddressError(
            f"{path} is open to other users (mode {stat.S_IMODE(st.st_mode):o}); run: chmod 700 {path}"
        )


def default_addr() -> str:
    """The per-user default socket. Only builds the name: it does not create the
    directory, so the rank side never touches the filesystem for it."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    if not base or not os.path.isdir(base):
        base = tempfile.gettempdir()
    return f"ipc://{os.path.join(base, f'commviz-{os.getuid()}', 'watch.sock')}"


def parse(addr: str) -> tuple[str, str]:
    """Split and check an address: ('ipc', path) or ('tcp', 'host:port')."""
    if addr.startswith("ipc://"):
        path = addr[len("ipc://"):]
        if not path:
            raise AddressError(f"{addr!r}: no socket path after ipc://")
        return "ipc", path
    if addr.startswith("tcp://"):
        u = urlsplit(addr)
        if not u.hostname or u.port is None:
            raise AddressError(f"{addr!r}: expected tcp://HOST:PORT, e.g. tcp://127.0.0.1:5557")
        return "tcp", f"{u.hostname}:{u.port}"
    raise AddressError(f"{addr!r}: expected ipc:///path/to/socket or tcp://HOST:PORT")


def is_loopback(addr: str) -> bool:
    kind, rest = parse(addr)
    if kind == "ipc":
        return True
    host = rest.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
