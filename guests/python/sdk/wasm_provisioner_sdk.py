"""Write wasm-provisioner plugins in Python (componentize-py), contract 0.2
(`wit/0.2.0/provisioner.wit`, world `wasm-provisioner:plugin/plugin@0.2.0`).

The same shape as the Rust SDK (`guests/sdk`): a plugin is a subclass of
`Provisioner`, exported with `export`:

    import wasm_provisioner_sdk as sdk

    class Mine(sdk.Provisioner):
        def describe(self):
            return sdk.PluginInfo(name="mine", version="0.1.0")
        def provision(self, req): ...          # returns a sdk.Volume or raises
        def delete(self, req): ...             # returns None or raises
        # optional, default True:
        def should_provision(self, req): return True
        def should_delete(self, req): return True
        # optional capabilities: define any of
        def expand(self, req): ...             # `expand`: returns the new size in bytes
        def get_capacity(self, req): ...       # `report-capacity`: returns sdk.capacity(...)
        def validate_class(self, cls): ...     # `validate-class`: raises to refuse

    sdk.export(Mine)

Capabilities: a plugin has exactly the optional capabilities whose method it defines.
componentize-py builds for the world it is given, so the world is made per plugin:
`wasm_provisioner_world.py` (beside this file; `build.sh` runs it) reads the app's
source, finds the class given to `export` and its methods, and writes a world that
exports those capabilities' interfaces. `export` then checks, while componentize-py
loads the app, that the world's exports and the methods agree (a mismatch fails the
build, naming both), fills `describe`'s `capabilities` to match, and defines the
classes componentize-py looks for in the app's module (`Provisioner`, `Expander`,
`CapacityReporter`, `ClassValidator`): so subclass `sdk.Provisioner`, and do not import
it under its bare name.

Answers other than a volume (or a successful delete, or a new size) are raised:
`Infeasible(msg)`, `Failed(msg)`, `Ignored(msg)`, `InBackground(msg)`,
`Reschedule(msg)`. A `ParamError` from the parameter helpers is `Infeasible` in
`provision` and `expand`, `Failed` in `delete`. In `validate_class` and `get_capacity`,
any exception is the error message the host gets (raise `ParamError` or
`ValueError`). Any other exception in the other calls is logged at error level with its
traceback and traps the call (like a Rust panic): the host reports it as `trap`.

Every call runs in a fresh instance: keep no state between calls. Every call may be
repeated: be idempotent by PV name. Claim names, labels and annotations are hostile
input: check them (`check_component`, `check_pv_name`) before building a path.
"""

import os
import re
import stat as _stat
import sys
import time
import traceback
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import wit_world
import wit_world.exports
from componentize_py_types import Err
from wit_world.imports import filesystem as _filesystem
from wit_world.imports import log as _log
from wit_world.imports import types

# The contract's types under their generated names (see `wit/0.2.0/provisioner.wit`).
from wit_world.imports.types import (  # noqa: F401  (re-exported)
    AccessMode,
    BackendCapacity,
    BindingMode,
    CallContext,
    Capability,
    CapacityRequest,
    Claim,
    Class,
    CsiSource,
    DataSource,
    DeleteRequest,
    ExpandRequest,
    HostPathSource,
    IscsiSource,
    LocalSource,
    NfsSource,
    Node,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    ProvisionRequest,
    PublishedVolume,
    ReclaimPolicy,
    Secret,
    Volume,
    VolumeMode,
)

__all__ = [
    "Provisioner", "export", "capabilities_of", "PluginInfo", "Volume", "ProvisionRequest",
    "DeleteRequest", "ExpandRequest", "CapacityRequest", "capacity", "stat_filesystem",
    "Infeasible", "Failed", "Ignored", "InBackground", "Reschedule", "ParamError",
    "Params", "host_path", "local", "nfs", "csi", "json_source", "hostname_affinity",
    "volume", "lookup", "parse_quantity", "format_bytes", "check_component",
    "check_pv_name", "join", "remove_tree", "delete_budget", "DELETE_CHUNK_PARAMETER",
    "DEFAULT_DELETE_CHUNK", "trace", "debug", "info", "warn", "error",
]


# --- Logging over the `log` import ---------------------------------------------------

def _emit(level, message: str, fields: Dict[str, object]) -> None:
    _log.log(level, str(message), [(str(k), str(v)) for k, v in fields.items()])


def trace(message: str, **fields) -> None:
    """`sdk.info("provisioning", volume=req.volume_name)`: one structured line."""
    _emit(_log.Level.TRACE, message, fields)


def debug(message: str, **fields) -> None:
    _emit(_log.Level.DEBUG, message, fields)


def info(message: str, **fields) -> None:
    _emit(_log.Level.INFO, message, fields)


def warn(message: str, **fields) -> None:
    _emit(_log.Level.WARN, message, fields)


def error(message: str, **fields) -> None:
    _emit(_log.Level.ERROR, message, fields)


# --- Answers ----------------------------------------------------------------------------

class Answer(Exception):
    """A plugin's own error answer; raise one of the subclasses."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class Ignored(Answer):
    """Not mine: no Warning Event, no retry (provision and delete)."""


class Failed(Answer):
    """Finished with an error, nothing left running: retried with back-off."""


class InBackground(Answer):
    """Not finished: the host keeps asking (provision and delete)."""


class Reschedule(Answer):
    """The selected node cannot host the volume (provision only)."""


class Infeasible(Answer):
    """Can never succeed as asked; retried slowly (provision only)."""


class ParamError(Exception):
    """A missing or malformed StorageClass parameter; the message names it and says
    what to set. `Infeasible` in `provision`, `Failed` in `delete`."""


def _provision_error(answer: Exception):
    message = str(answer)
    if isinstance(answer, Ignored):
        return types.ProvisionError_Ignored(message)
    if isinstance(answer, InBackground):
        return types.ProvisionError_InBackground(message)
    if isinstance(answer, Reschedule):
        return types.ProvisionError_Reschedule(message)
    if isinstance(answer, (Infeasible, ParamError)):
        return types.ProvisionError_Infeasible(message)
    return types.ProvisionError_Failed(message)


def _expand_error(answer: Exception):
    message = str(answer)
    if isinstance(answer, InBackground):
        return types.ExpandError_InBackground(message)
    if isinstance(answer, (Infeasible, ParamError)):
        return types.ExpandError_Infeasible(message)
    if isinstance(answer, (Ignored, Reschedule)):
        return types.ExpandError_Failed(
            f"{message} (a {type(answer).__name__} answer is not an expand answer: failed)")
    return types.ExpandError_Failed(message)


def _delete_error(answer: Exception):
    message = str(answer)
    if isinstance(answer, Ignored):
        return types.DeleteError_Ignored(message)
    if isinstance(answer, InBackground):
        return types.DeleteError_InBackground(message)
    if isinstance(answer, (Reschedule, Infeasible)):
        # Not delete answers: a plugin bug, said plainly rather than trapping.
        return types.DeleteError_Failed(
            f"{message} (a {type(answer).__name__} answer is not a delete answer: failed)")
    return types.DeleteError_Failed(message)


# --- The plugin class and its export ----------------------------------------------------

class Provisioner:
    """Subclass and override `describe`, `provision`, `delete` (and optionally
    `should_provision`, `should_delete`). Define `expand`, `get_capacity` or
    `validate_class` to have that capability."""

    def describe(self) -> types.PluginInfo:
        raise NotImplementedError("describe")

    def should_provision(self, req: ProvisionRequest) -> bool:
        return True

    def provision(self, req: ProvisionRequest) -> Volume:
        raise NotImplementedError("provision")

    def should_delete(self, req: DeleteRequest) -> bool:
        return True

    def delete(self, req: DeleteRequest) -> None:
        raise NotImplementedError("delete")


# The optional capabilities: (plugin method, capability, class componentize-py looks
# for, WIT interface). `wasm_provisioner_world.py` keeps the same table.
CAPABILITIES = [
    ("expand", "EXPAND", "Expander", "expander"),
    ("get_capacity", "REPORT_CAPACITY", "CapacityReporter", "capacity-reporter"),
    ("validate_class", "VALIDATE_CLASS", "ClassValidator", "class-validator"),
]


def capabilities_of(plugin_class) -> List[str]:
    """The WIT interfaces of the capabilities `plugin_class` has (defines the method of)."""
    return [iface for method, _, _, iface in CAPABILITIES
            if callable(getattr(plugin_class, method, None))]


def PluginInfo(name: str, version: str, supports_block: bool = False,  # noqa: N802
               data_source_kinds: Sequence[str] = ()) -> types.PluginInfo:
    """What `describe` answers; `export` fills in `capabilities`."""
    return types.PluginInfo(name=name, version=version, supports_block=supports_block,
                            data_source_kinds=list(data_source_kinds), capabilities=[])


def capacity(total_bytes: int, available_bytes: int,
             maximum_volume_bytes: Optional[int] = None) -> BackendCapacity:
    """A `get_capacity` answer."""
    return BackendCapacity(
        total_bytes=int(total_bytes), available_bytes=int(available_bytes),
        maximum_volume_bytes=None if maximum_volume_bytes is None else int(maximum_volume_bytes))


def stat_filesystem(path: str):
    """Usage of the filesystem holding `path`, a path inside a granted directory as the
    plugin sees it (such as "/volumes"): `.total_bytes`, `.available_bytes`. Raises
    `Failed` when the host cannot answer (outside every grant, ...)."""
    try:
        return _filesystem.stat_filesystem(path)
    except Err as err:
        raise Failed(f"cannot stat the filesystem of {path}: {err.value}") from None


def _trap(call: str, exc: BaseException) -> None:
    # Like the Rust SDK's panic hook: say what went wrong before the call traps.
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    error(f"panic: {call}: {type(exc).__name__}: {exc}", traceback=text)


def export(plugin_class):
    """Exports `plugin_class`: defines, in the module that defines it (the app), the
    classes componentize-py instantiates for each interface the world exports, and
    checks that those are exactly the plugin's capabilities. Returns them by name."""
    plugin = plugin_class()
    has = capabilities_of(plugin_class)
    exported = [iface for _, _, cls, iface in CAPABILITIES if hasattr(wit_world.exports, cls)]
    if has != exported:
        raise RuntimeError(
            f"{plugin_class.__name__} has the capabilities [{', '.join(has)}] (the methods it "
            f"defines) but the world it is built for exports [{', '.join(exported)}]: build "
            "with the world wasm_provisioner_world.py writes for this app (build.sh does); it "
            "sees only methods defined in the app file, in the exported class or its bases there")
    listed = [getattr(types.Capability, cap) for method, cap, _, _ in CAPABILITIES
              if callable(getattr(plugin_class, method, None))]

    class Provisioner(wit_world.exports.Provisioner):
        def describe(self) -> types.PluginInfo:
            try:
                info = plugin.describe()
                info.capabilities = list(listed)
                return info
            except BaseException as exc:
                _trap("describe", exc)
                raise

        def should_provision(self, request: ProvisionRequest) -> bool:
            try:
                return bool(plugin.should_provision(request))
            except BaseException as exc:
                _trap("should-provision", exc)
                raise

        def provision(self, request: ProvisionRequest) -> Volume:
            try:
                return plugin.provision(request)
            except (Answer, ParamError) as answer:
                raise Err(_provision_error(answer))
            except BaseException as exc:
                _trap("provision", exc)
                raise

        def should_delete(self, request: DeleteRequest) -> bool:
            try:
                return bool(plugin.should_delete(request))
            except BaseException as exc:
                _trap("should-delete", exc)
                raise

        def delete(self, request: DeleteRequest) -> None:
            try:
                plugin.delete(request)
            except (Answer, ParamError) as answer:
                raise Err(_delete_error(answer))
            except BaseException as exc:
                _trap("delete", exc)
                raise

    classes = {"Provisioner": Provisioner}
    if "expander" in has:
        class Expander(wit_world.exports.Expander):
            def expand(self, request: ExpandRequest) -> int:
                try:
                    return int(plugin.expand(request))
                except (Answer, ParamError) as answer:
                    raise Err(_expand_error(answer))
                except BaseException as exc:
                    _trap("expand", exc)
                    raise

        classes["Expander"] = Expander
    if "capacity-reporter" in has:
        class CapacityReporter(wit_world.exports.CapacityReporter):
            def get_capacity(self, request: CapacityRequest) -> BackendCapacity:
                try:
                    return plugin.get_capacity(request)
                except Exception as exc:
                    raise Err(str(exc))

        classes["CapacityReporter"] = CapacityReporter
    if "class-validator" in has:
        class ClassValidator(wit_world.exports.ClassValidator):
            def validate_class(self, class_: Class) -> None:
                try:
                    plugin.validate_class(class_)
                except Exception as exc:
                    raise Err(str(exc))

        classes["ClassValidator"] = ClassValidator
    app = sys.modules.get(plugin_class.__module__)
    if app is not None:
        for name, cls in classes.items():
            setattr(app, name, cls)
    return classes


# --- Builders ---------------------------------------------------------------------------

def host_path(path: str, path_type: Optional[str] = "Directory"):
    return types.VolumeSource_HostPath(types.HostPathSource(path=path, path_type=path_type))


def local(path: str, fs_type: Optional[str] = None):
    return types.VolumeSource_Local(types.LocalSource(path=path, fs_type=fs_type))


def nfs(server: str, path: str, read_only: bool = False):
    return types.VolumeSource_Nfs(types.NfsSource(server=server, path=path, read_only=read_only))


def csi(driver: str, volume_handle: str, fs_type: Optional[str] = None,
        read_only: bool = False, volume_attributes: Sequence[Tuple[str, str]] = ()):
    return types.VolumeSource_Csi(types.CsiSource(
        driver=driver, volume_handle=volume_handle, fs_type=fs_type, read_only=read_only,
        volume_attributes=list(volume_attributes)))


def json_source(text: str):
    """Any other PersistentVolumeSource as JSON with one key, e.g. `{"cephfs": {...}}`."""
    return types.VolumeSource_Json(text)


def hostname_affinity(node: str) -> List[NodeSelectorTerm]:
    """Node affinity `kubernetes.io/hostname In [node]`."""
    return [NodeSelectorTerm(match_expressions=[NodeSelectorRequirement(
        key="kubernetes.io/hostname", operator="In", values=[node])])]


def volume(capacity_bytes: int, source, *, node: Optional[str] = None,
           labels: Optional[Dict[str, str]] = None,
           annotations: Optional[Dict[str, str]] = None,
           mount_options: Sequence[str] = (), volume_mode=None) -> Volume:
    """A `Volume` answer; `node` adds hostname node affinity."""
    return Volume(
        capacity_bytes=int(capacity_bytes),
        source=source,
        node_affinity=hostname_affinity(node) if node else [],
        labels=sorted((labels or {}).items()),
        annotations=sorted((annotations or {}).items()),
        mount_options=list(mount_options),
        volume_mode=volume_mode,
    )


def lookup(pairs: Iterable[Tuple[str, str]], key: str) -> Optional[str]:
    """A value of a string map (labels, annotations, parameters), or None."""
    for k, v in pairs:
        if k == key:
            return v
    return None


# --- Parameters -------------------------------------------------------------------------

_TRUE = {"1", "t", "T", "true", "TRUE", "True"}
_FALSE = {"0", "f", "F", "false", "FALSE", "False"}


class Params:
    """A view of a StorageClass's parameters. An empty value counts as absent; every
    error is a `ParamError` naming the parameter and saying what to set."""

    def __init__(self, pairs: Iterable[Tuple[str, str]]):
        self._map = {k: v for k, v in pairs}

    def is_empty(self) -> bool:
        return not self._map

    def get(self, key: str) -> Optional[str]:
        value = self._map.get(key)
        return value if value else None

    def get_or(self, key: str, default: str) -> str:
        return self.get(key) or default

    def require(self, key: str, hint: str) -> str:
        value = self.get(key)
        if value is None:
            raise ParamError(f"StorageClass parameter `{key}` is required: {hint}")
        return value

    def one_of(self, key: str, allowed: Sequence[str], default: str) -> str:
        value = self.get_or(key, default)
        if value not in allowed:
            raise ParamError(
                f"StorageClass parameter `{key}` is {value!r}: set it to one of "
                + ", ".join(allowed))
        return value

    def bool(self, key: str, default: bool) -> bool:
        value = self.get(key)
        if value is None:
            return default
        if value in _TRUE:
            return True
        if value in _FALSE:
            return False
        raise ParamError(f"StorageClass parameter `{key}` is {value!r}: set it to true or false")

    def quantity(self, key: str, default: Optional[str], hint: str) -> int:
        """A Kubernetes quantity (`10Gi`, `500M`, `1048576`) in bytes."""
        value = self.get(key) if default is None else self.get_or(key, default)
        if value is None:
            raise ParamError(f"StorageClass parameter `{key}` is required: {hint}")
        try:
            return parse_quantity(value)
        except ValueError as exc:
            raise ParamError(f"StorageClass parameter `{key}`: {exc}") from None

    def absolute_path(self, key: str, default: Optional[str], hint: str) -> str:
        value = self.get_or(key, default) if default is not None else self.require(key, hint)
        try:
            return check_absolute(value)
        except ValueError as exc:
            raise ParamError(
                f"StorageClass parameter `{key}`: {exc}: set it to an absolute path") from None

    def reject_unknown(self, known: Sequence[str]) -> None:
        unknown = sorted(k for k in self._map if k not in known)
        if unknown:
            raise ParamError(
                f"unknown StorageClass parameter(s) {', '.join(unknown)}: the known ones are "
                + ", ".join(known))


_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_QUANTITY = re.compile(
    r"^([+-]?)([0-9]*)(?:\.([0-9]*))?([eE][+-]?[0-9]{1,6}|Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]?)$")


def parse_quantity(text: str) -> int:
    """Bytes of a Kubernetes quantity (`10Gi`, `500M`, `1.5Gi`, `1e9`, `100m`), exactly as
    the API server and the host read it: the grammar of `apimachinery/pkg/api/resource`,
    integer arithmetic, a fraction of a byte rounded up (as `Quantity.Value()` does).
    ValueError (naming the text) when it is not a quantity, is negative or is 16Ei or
    more."""
    match = _QUANTITY.match(text)
    if not match or not (match.group(2) or match.group(3)):
        raise ValueError(
            f"{text!r} is not a Kubernetes quantity: write it like 10Gi, 500M or 1e9")
    sign, whole, fraction, suffix = match.groups()
    fraction = fraction or ""
    if len((whole + fraction).strip("0")) > 38:
        raise ValueError(f"{text!r} has more than 38 significant digits")
    # value = numerator / denominator, exactly.
    numerator, denominator = int(whole + fraction or "0"), 10 ** len(fraction)
    if numerator == 0:
        return 0
    if sign == "-":
        raise ValueError(f"{text!r} is negative: a size must be zero or more")
    if suffix in _BINARY:
        numerator <<= _BINARY[suffix]
        exponent = 0
    elif suffix in _DECIMAL:
        exponent = _DECIMAL[suffix]
    else:
        exponent = int(suffix[1:])
    # Bounds before the powers: value >= 10^(exponent - len(fraction)) and
    # value < 10^(len(whole) + exponent).
    if exponent - len(fraction) >= 20:
        raise ValueError(f"{text!r} is too large: a size must fit in 64 bits of bytes (under 16Ei)")
    if len(whole) + exponent <= 0:
        return 1  # 0 < value < 1: one byte
    if exponent >= 0:
        numerator *= 10 ** exponent
    else:
        denominator *= 10 ** -exponent
    size = -(-numerator // denominator)
    if size >= 2**64:
        raise ValueError(f"{text!r} is too large: a size must fit in 64 bits of bytes (under 16Ei)")
    return size


def format_bytes(n: int) -> str:
    """`10Gi`, `1536Mi`, or plain bytes: the largest binary suffix that divides `n`."""
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        unit = 1 << _BINARY[suffix]
        if n and n % unit == 0:
            return f"{n // unit}{suffix}"
    return str(n)


# --- Paths ------------------------------------------------------------------------------

_PV_NAME = re.compile(r"^pvc-[a-z0-9-]{1,249}$")


def check_component(name: str) -> str:
    """One path component: refuses empty, `.`, `..`, `/`, NUL, control characters and
    names over 255 bytes (ValueError)."""
    if name in ("", ".", ".."):
        raise ValueError(f"{name!r} is not a usable name")
    if "/" in name or any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in name):
        raise ValueError(f"{name!r} contains `/` or a control character")
    if len(name.encode()) > 255:
        raise ValueError(f"{name[:40]!r}... is longer than 255 bytes")
    return name


def check_pv_name(name: str) -> str:
    """A PV name as the host makes them: `pvc-` then 1-249 of `[a-z0-9-]`."""
    if not _PV_NAME.match(name):
        raise ValueError(f"{name!r} is not a PV name of this host (pvc-<claim uid>)")
    return name


def check_absolute(path: str) -> str:
    """An absolute path with every component checked, without repeated or trailing `/`."""
    if not path.startswith("/"):
        raise ValueError(f"{path!r} is not absolute")
    parts = [p for p in path.split("/") if p]
    for part in parts:
        check_component(part)
    normal = "/" + "/".join(parts)
    if len(normal.encode()) > 1024:
        raise ValueError(f"{path[:40]!r}... is longer than 1024 bytes")
    return normal


def join(base: str, *names: str) -> str:
    """`base/name/...` with each name checked as one component."""
    return "/".join([base.rstrip("/") or ""] + [check_component(n) for n in names]) or "/"


# --- Deleting what a tenant wrote, in bounded chunks ------------------------------------

DELETE_CHUNK_PARAMETER = "deleteChunkEntries"
"""The StorageClass parameter bounding one `delete` call's work (entries removed)."""
DEFAULT_DELETE_CHUNK = 100_000
"""Entries one `delete` call removes at most when the class does not say (as the Rust SDK)."""


def delete_budget(params: "Params") -> int:
    """The entries one `delete` call may remove: the class parameter `deleteChunkEntries`
    (1 to 10000000), else `DEFAULT_DELETE_CHUNK`. ParamError names the parameter."""
    text = params.get(DELETE_CHUNK_PARAMETER)
    if text is None:
        return DEFAULT_DELETE_CHUNK
    if text.isdigit() and 1 <= int(text) <= 10_000_000:
        return int(text)
    raise ParamError(
        f"StorageClass parameter `{DELETE_CHUNK_PARAMETER}` is {text!r}: set it to a whole "
        f"number of entries from 1 to 10000000 (default {DEFAULT_DELETE_CHUNK})")


def remove_tree(path: str, budget: int, seconds: float = 1.0) -> Tuple[int, bool]:
    """Removes the directory `path` and everything in it, in bounded, resumable chunks:
    iteratively (a deep tree costs no stack), never following a symbolic link (a link is
    removed, not what it points to), and stopping after `budget` entries or `seconds`,
    whichever comes first. Returns (entries removed, whether `path` is gone); a missing
    `path` is (0, True). Call it again with the same path to go on: raise
    `InBackground` meanwhile, and the host calls `delete` again:

        removed, done = sdk.remove_tree(path, sdk.delete_budget(params))
        if not done:
            raise sdk.InBackground(f"deleted {removed} entries of {path}; the rest goes next")

    `path` itself must be a directory, not a symbolic link (`Failed` otherwise)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return 0, True
    if not _stat.S_ISDIR(mode):
        raise Failed(f"{path} is not a directory (a symbolic link or a file); not touched")
    deadline = time.monotonic() + seconds
    removed = 0
    stack = [path]
    while stack:
        top = stack[-1]
        descended = False
        with os.scandir(top) as entries:
            for entry in entries:
                if removed >= budget or time.monotonic() >= deadline:
                    return removed, False
                if _stat.S_ISDIR(entry.stat(follow_symlinks=False).st_mode):
                    stack.append(entry.path)
                    descended = True
                    break
                os.unlink(entry.path)
                removed += 1
        if not descended:
            if removed >= budget:
                return removed, False
            os.rmdir(top)
            removed += 1
            stack.pop()
    return removed, True

