"""What every ``posenc`` option is checked against at parse time, the size limit, and the
reading and writing of the files options name.

Each option gets the check of an :class:`OptionCheck` from here (:class:`Text`,
:class:`Choice`, :class:`Number`, :class:`Integer`; typer's option by :func:`option`), so a
bad value is refused while the command line is parsed, before anything is built: one line
naming the option, the rule and the value (``--width must be finite, got inf``), exit code
2. An integer or a number option takes plain digits only (:func:`plain_integer`,
:func:`plain_number`: no ``_``, ``+`` or spaces, which Python's ``int`` and ``float`` would
accept). Sizes are estimated before anything is allocated and refused over
:func:`byte_limit`, with the estimate and the option that asks for it. A file an option
names is read only when it is a regular file within a cap (:func:`read_option_file`), and
written through :func:`write_option_file`, which names the option when the write fails.
"""

from __future__ import annotations

import abc
import errno
import os
import re
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from posenc._errors import PosEncError, check_float, check_int
from posenc._files import file_kind, read_regular

__all__ = [
    "MAX_BYTES",
    "MIB",
    "Choice",
    "Integer",
    "Number",
    "OptionCheck",
    "Text",
    "byte_limit",
    "check_bytes",
    "check_out_dir",
    "check_out_file",
    "check_regular_file",
    "choice",
    "human_bytes",
    "integer",
    "number",
    "option",
    "plain_integer",
    "plain_number",
    "read_option_file",
    "text",
    "write_option_file",
]

MIB = 1 << 20

#: The most memory one ``posenc`` command may ask for (less when less is free).
MAX_BYTES = 8 * 2**30
#: Errors of the environment, not of the command line: exit code 1.
_ENVIRONMENT = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT}


def _available() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _env_cap() -> int | None:
    """``POSENC_MAX_ALLOC_BYTES`` (the library's cap on one tensor) where it is set."""
    raw = os.environ.get("POSENC_MAX_ALLOC_BYTES")
    if raw is None:
        return None
    if not _INTEGER.fullmatch(raw.strip()):
        raise PosEncError(f"POSENC_MAX_ALLOC_BYTES must be an integer, got {raw!r}")
    return max(int(raw), 0)


def byte_limit(cap: int | None = MAX_BYTES) -> int:
    """``cap`` (:data:`MAX_BYTES`), or half the free memory when that is less; ``cap=None``:
    half the free memory (or :data:`MAX_BYTES` where it cannot be read). Never more than
    ``POSENC_MAX_ALLOC_BYTES`` where that is set."""
    free = _available()
    if free is None:
        limit = MAX_BYTES if cap is None else cap
    else:
        limit = free // 2 if cap is None else min(cap, free // 2)
    env = _env_cap()
    return limit if env is None else min(limit, env)


def human_bytes(n: float) -> str:
    """``80 GB``, ``3.2 TB``: decimal units, three digits (any size: an integer past the
    float range reads ``1e+300 PB`` and more)."""
    n = float(min(n, 10**300)) if isinstance(n, int) else n
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:.3g} {unit}"
        n /= 1000
    return f"{n:.3g} PB"  # pragma: no cover


def check_bytes(
    what: str, nbytes: float, hint: str = "ask for fewer positions or channels"
) -> None:
    """Refuse ``what`` when it needs more than :func:`byte_limit` bytes: ``what`` names
    the option (or the file's key) that asks for it, ``hint`` what to ask for instead."""
    limit = byte_limit()
    if nbytes > limit:
        raise PosEncError(
            f"{what} needs about {human_bytes(nbytes)} of memory, over the limit of "
            f"{human_bytes(limit)}; {hint}"
        )


_INTEGER = re.compile(r"-?[0-9]+")
_NUMBER = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]{1,4})?")


def plain_integer(value: Any) -> Any:
    """The ``parser`` of an integer option: digits with an optional leading ``-``. Python's
    ``int`` also takes ``1_000``, ``+8`` and `` 8 ``; a typo there is refused, not read.
    A value that is already an int (the option's default) passes as it is."""
    if isinstance(value, str):
        if not _INTEGER.fullmatch(value):
            raise typer.BadParameter(
                f"must be an integer in plain digits (an optional leading '-'; no '_', '+', "
                f"spaces or decimal point), got {value!r}"
            )
        try:
            return int(value)
        except ValueError:  # over sys.get_int_max_str_digits() digits
            raise typer.BadParameter(
                f"must be an integer that fits in 64 bits, got {len(value)} digits"
            ) from None
    return value


def plain_number(value: Any) -> Any:
    """The ``parser`` of a number option: a decimal such as ``-1.5``, ``.5`` or ``2e-3``
    (no ``_``, ``+``, spaces, ``inf`` or ``nan``). A float or int passes as it is."""
    if isinstance(value, str):
        if not _NUMBER.fullmatch(value):
            raise typer.BadParameter(
                f"must be a finite number in plain digits such as 1.5, .5 or 2e-3 (no '_', "
                f"'+', spaces, inf or nan), got {value!r}"
            )
        return float(value)
    return value


class OptionCheck(abc.ABC):
    """The parse-time check of one option. Its bound :meth:`check` is typer's ``callback``
    (it checks the value the option was given, or its default; ``None`` passes); an integer
    or a number also gives typer its ``parser`` (:attr:`parse`: the command line's string
    into the value) and the ``metavar`` of its help. A syntax error is a usage error (exit
    code 2, ``Invalid value for '--dim'``), a value out of its bounds a :class:`PosEncError`
    naming ``option``.

    typer (0.29 on) runs its own copy of click, with no ``click.ParamType`` and no
    ``click_type=``: an option's type is its ``parser`` callable, and a check whose message
    is the library's own (not ``Invalid value for ...``) is its ``callback``, which typer
    requires to be a function or a method.
    """

    def __init__(
        self,
        option: str,
        *,
        parse: Callable[[Any], Any] | None = None,
        metavar: str | None = None,
    ) -> None:
        self.option = option
        self.parse = parse
        self.metavar = metavar

    @abc.abstractmethod
    def check(self, value: Any) -> Any:
        """``value`` (as it is) when it passes, else a :class:`PosEncError`."""


class Text(OptionCheck):
    """None, or a string (or each string of a list) neither empty, all blank nor holding a
    NUL."""

    def check(self, value: Any) -> Any:
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if item is None:
                continue
            if not str(item).strip():
                raise PosEncError(f"{self.option} must not be empty, got {str(item)!r}")
            if "\x00" in str(item):
                raise PosEncError(f"{self.option} must not hold a NUL character, got {str(item)!r}")
        return value


class Choice(OptionCheck):
    """None, or one of ``choices`` (an empty string is not the default)."""

    def __init__(self, option: str, choices: tuple[str, ...] | list[str]) -> None:
        super().__init__(option)
        self.choices = tuple(choices)

    def check(self, value: Any) -> Any:
        if value is not None and value not in self.choices:
            listed = ", ".join(repr(c) for c in self.choices)
            raise PosEncError(f"{self.option} must be one of {listed}, got {value!r}")
        return value


class Number(OptionCheck):
    """None, or a finite float in the bounds (``exclusive``: above ``min``), read by
    :func:`plain_number`."""

    def __init__(
        self,
        option: str,
        *,
        min: float | None = None,
        max: float | None = None,
        exclusive: bool = False,
    ) -> None:
        super().__init__(option, parse=plain_number, metavar="<float>")
        self.min, self.max, self.exclusive = min, max, exclusive

    def check(self, value: Any) -> Any:
        if value is None:
            return None
        return check_float(
            self.option, value, min=self.min, max=self.max, min_exclusive=self.exclusive
        )


class Integer(OptionCheck):
    """None, or an integer in ``[min, max]``, read by :func:`plain_integer`."""

    def __init__(self, option: str, *, min: int | None = None, max: int | None = None) -> None:
        super().__init__(option, parse=plain_integer, metavar="<int>")
        self.min, self.max = min, max

    def check(self, value: Any) -> Any:
        if value is None:
            return None
        return check_int(self.option, value, min=self.min, max=self.max)


def option(help: str, check: Callable[[Any], Any], *names: str) -> Any:
    """A typer option: its help text and its parse-time ``check`` (an
    :meth:`OptionCheck.check`, from :func:`text`, :func:`choice`, :func:`number` or
    :func:`integer`, or any callback); ``names`` (``"--out", "-o"``) where the parameter's
    own name is not enough. An :class:`Integer` or :class:`Number` brings its plain-digits
    parser and metavar."""
    owner = getattr(check, "__self__", None)
    if isinstance(owner, OptionCheck) and owner.parse is not None:
        return typer.Option(
            *names, help=help, callback=check, parser=owner.parse, metavar=owner.metavar
        )
    return typer.Option(*names, help=help, callback=check)


def text(option: str) -> Callable[[Any], Any]:
    """The callback of a text option (:class:`Text`)."""
    return Text(option).check


def choice(option: str, choices: tuple[str, ...] | list[str]) -> Callable[[Any], Any]:
    """The callback of an option taking one of ``choices`` (:class:`Choice`)."""
    return Choice(option, choices).check


def number(
    option: str, *, min: float | None = None, max: float | None = None, exclusive: bool = False
) -> Callable[[Any], Any]:
    """The callback of a number option (:class:`Number`)."""
    return Number(option, min=min, max=max, exclusive=exclusive).check


def integer(option: str, *, min: int | None = None, max: int | None = None) -> Callable[[Any], Any]:
    """The callback of an integer option (:class:`Integer`)."""
    return Integer(option, min=min, max=max).check


def _refused(option: str, path: Path, e: OSError) -> OSError | PosEncError:
    """The environment's refusal as an OSError (exit 1), a bad path as a PosEncError."""
    if e.errno in _ENVIRONMENT:
        return OSError(e.errno, f"{option} {str(path)!r} cannot be written ({e.strerror})")
    return PosEncError(f"{option} {str(path)!r} cannot be created ({e.strerror})")


def check_out_file(path: str, suffixes: tuple[str, ...] | list[str], option: str = "--out") -> Path:
    """``path`` as a Path if its suffix is allowed and its folder exists and is writable.

    Raises:
        PosEncError: empty, a directory, a wrong suffix, a folder that does not exist, or
            a path the system refuses (a name too long).
        OSError: the folder (or the file) is not writable.
    """
    text(option)(path)
    out = Path(path)
    suffix = out.suffix.lstrip(".").lower()
    if suffix not in suffixes:
        raise PosEncError(
            f"{option} must end in {' or '.join('.' + s for s in suffixes)}, got {str(out)!r}"
        )
    parent = out.parent if str(out.parent) else Path(".")
    try:
        is_dir, parent_is_dir = out.is_dir(), parent.is_dir()
        writable = os.access(parent, os.W_OK | os.X_OK) and (
            not out.exists() or os.access(out, os.W_OK)
        )
    except OSError as e:  # the path itself refused (a name too long, a loop of links)
        raise _refused(option, out, e) from None
    if is_dir:
        raise PosEncError(f"{option} must be a file, got the directory {str(out)!r}")
    if not parent_is_dir:
        raise PosEncError(f"{option} folder does not exist: {str(parent)!r}")
    if not writable:
        raise OSError(errno.EACCES, f"{option} is not writable: {str(out)!r}")
    return out


def check_out_dir(path: str, option: str = "--out", *, create: bool = True) -> Path:
    """``path`` as a Path if it is (or can be created as) a writable directory.

    ``create=False`` checks without creating anything: the nearest existing folder above
    ``path`` must be a writable directory (the command creates the rest once its other
    options are known to be good).

    Raises:
        PosEncError: empty, an existing file, or under a file.
        OSError: the directory cannot be created or written (permissions, a read-only or
            full file system).
    """
    text(option)(path)
    out = Path(path)
    try:
        if out.exists() and not out.is_dir():
            raise PosEncError(f"{option} must be a directory, got the file {str(out)!r}")
    except OSError as e:  # the path itself refused (a name too long, a loop of links)
        raise _refused(option, out, e) from None
    if not create:
        existing = next(p for p in (out, *out.absolute().parents) if p.exists())
        if not existing.is_dir():
            raise PosEncError(
                f"{option} {str(out)!r} cannot be created (Not a directory: {str(existing)!r})"
            )
        if not os.access(existing, os.W_OK | os.X_OK):
            raise OSError(errno.EACCES, f"{option} is not writable: {str(out)!r}")
        return out
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _refused(option, out, e) from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise OSError(errno.EACCES, f"{option} is not writable: {str(out)!r}")
    return out


def _unreadable(option: str, path: str, e: OSError) -> OSError | PosEncError:
    """The environment's refusal (permissions) as an OSError (exit 1), else a PosEncError."""
    if e.errno in _ENVIRONMENT:
        return OSError(e.errno, f"{option} {path!r} cannot be read ({e.strerror})")
    return PosEncError(f"{option} {path!r} cannot be read ({e.strerror or type(e).__name__})")


def check_regular_file(option: str, path: str) -> None:
    """Refuse ``path`` unless it is an existing regular file (a link to one is one; a FIFO,
    a device such as ``/dev/zero``, a directory is not), before anything opens it.

    Raises:
        PosEncError: missing, not a regular file, or a path the system refuses (too long).
        OSError: the environment refuses to look (permissions).
    """
    text(option)(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise PosEncError(f"{option} must be an existing file, got {path!r}") from None
    except OSError as e:
        raise _unreadable(option, path, e) from None
    if not stat.S_ISREG(mode):
        raise PosEncError(f"{option} must be a regular file, got {file_kind(mode)}: {path!r}")


def read_option_file(option: str, path: str, *, max_bytes: int) -> bytes:
    """The bytes of the regular file ``path`` an option names, at most ``max_bytes``.

    The file is opened without blocking (a FIFO would wait for a writer forever) and
    ``fstat`` must say it is a regular file (a link to ``/dev/zero`` would be read until
    memory runs out); its size is checked before a byte is read, and a file that grows past
    the cap while it is read is refused too.

    Raises:
        PosEncError: missing, not a regular file, or over ``max_bytes``.
        OSError: the environment refuses to read it (permissions).
    """
    check_regular_file(option, path)
    try:  # it checks again, on the descriptor it reads
        return read_regular(path, what=option, max_bytes=max_bytes)
    except OSError as e:
        raise _unreadable(option, path, e) from None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_option_file(option: str, path: Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` (named by ``option``) through a temporary file in its
    folder, renamed over it once whole; nothing is left behind when the write fails.

    Raises:
        OSError: the environment refuses (no permission, a read-only or full file system),
            naming the option: exit code 1.
        PosEncError: any other failure to write (a virtual file system such as ``/proc``, a
            name the system refuses), naming the option: exit code 2.
    """
    tmp: str | None = None
    try:
        try:
            fd, tmp = tempfile.mkstemp(prefix=".posenc-", suffix=".tmp", dir=path.parent)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.chmod(tmp, 0o666 & ~_umask())  # as open() would have made it
            os.replace(tmp, path)
        except BaseException:
            if tmp is not None and os.path.exists(tmp):
                os.unlink(tmp)
            raise
    except OSError as e:
        if e.errno in _ENVIRONMENT:
            raise OSError(
                e.errno, f"{option} {str(path)!r} cannot be written ({e.strerror})"
            ) from None
        raise PosEncError(
            f"{option} {str(path)!r} cannot be written ({e.strerror or type(e).__name__})"
        ) from None
    return path
