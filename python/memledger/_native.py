"""libmemledger through ctypes: finding the library, the functions' types,
and ml_error (the one struct of the C API laid out here; the settings stay
in C behind the ml_job handle of include/memledger/json.h)."""
import ctypes
import ctypes.util
import os

_HERE = os.path.dirname(os.path.abspath(__file__))


class _MlError(ctypes.Structure):
    # include/memledger/error.h
    _fields_ = [("code", ctypes.c_int), ("path", ctypes.c_char * 512),
                ("line", ctypes.c_uint), ("col", ctypes.c_uint),
                ("msg", ctypes.c_char * 512)]


class Error(Exception):
    """A failure the library reported: code ("ML_SCHEMA"), status (its
    number), path, line and col (1-based; 0: no position) and message, as
    the C library's ml_error carries them; the message (and the path in the
    text of the exception) with control characters written visibly."""

    def __init__(self, code, status, path, line, col, message):
        self.code, self.status, self.path = code, status, path
        self.line, self.col, self.message = line, col, visible(message)
        where = visible(path)
        if path and line:
            where = "%s:%d:%d" % (where, line, col)
        super().__init__("%s: %s" % (where, self.message) if where else self.message)


def visible(text):
    """text with control characters written \\xNN as the command line
    writes them (docs/cli.md; src/cli/output.c): C0 but tab, and DEL, as
    their byte, C1 (U+0080 to U+009F) as its two UTF-8 bytes, \\xc2\\x9b. A
    value quoted back in a message cannot drive the reader's terminal."""
    def one(c):
        o = ord(c)
        if (o < 0x20 and c != "\t") or o == 0x7f:
            return "\\x%02x" % o
        return "\\xc2\\x%02x" % o if 0x80 <= o <= 0x9f else c
    return "".join(one(c) for c in text)


def _find():
    """MEMLEDGER_LIBRARY, else the library the wheel carries, else an
    installed libmemledger (meson install)."""
    env = os.environ.get("MEMLEDGER_LIBRARY")
    if env:
        return env
    bundled = os.path.join(_HERE, "_lib", "libmemledger.so.0")
    if os.path.exists(bundled):
        return bundled
    found = ctypes.util.find_library("memledger")
    if found:
        return found
    raise ImportError("memledger: libmemledger not found: install the package with "
                      "'pip install .' from a checkout, or set MEMLEDGER_LIBRARY")


_P = ctypes.c_void_p
_PP = ctypes.POINTER(ctypes.c_void_p)
_PE = ctypes.POINTER(_MlError)
_S = ctypes.c_char_p
_N = ctypes.c_size_t
_PN = ctypes.POINTER(ctypes.c_size_t)
_U64 = ctypes.c_uint64

_SIGNATURES = {
    "ml_status_name": (_S, [ctypes.c_int]),
    "ml_model_load_file": (ctypes.c_int, [_S, _PP, _PE]),
    "ml_model_load_string": (ctypes.c_int, [_S, _N, _S, _PP, _PE]),
    "ml_model_load_hf": (ctypes.c_int, [_S, _S, _PP, _PE]),
    "ml_model_load_hf_string": (ctypes.c_int, [_S, _N, _S, _PP, _PE]),
    "ml_model_destroy": (None, [_P]),
    "ml_model_set_attention": (ctypes.c_int, [_P, _S, _PE]),
    "ml_job_create": (ctypes.c_int, [_P, _PP, _PE]),
    "ml_job_destroy": (None, [_P]),
    "ml_job_set": (ctypes.c_int, [_P, _S, _S, _PE]),
    "ml_job_plan_json": (ctypes.c_int, [_P, _PP, _PN, _PE]),
    "ml_job_fit_json": (ctypes.c_int, [_P, _PP, _PN, _PE]),
    "ml_job_compare_json": (ctypes.c_int, [_P, _PP, _PN, _PE]),
    "ml_job_timeline_json": (ctypes.c_int, [_P, _PP, _PN, _PE]),
    "ml_points_json": (ctypes.c_int, [_S, _N, _S, _U64, _U64, _PP, _PN, _PE]),
    "ml_json_free": (None, [_P]),
    "ml_parse_size": (ctypes.c_int, [_S, ctypes.POINTER(_U64), _PE]),
}


def _load():
    lib = ctypes.CDLL(_find())
    for name, (res, args) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


lib = _load()


def new_error():
    return _MlError()


def check(status, err):
    """Raises Error from err when status is not ML_OK (0)."""
    if status == 0:
        return
    raise Error(lib.ml_status_name(status).decode(), status,
                err.path.decode("utf-8", "replace"), err.line, err.col,
                err.msg.decode("utf-8", "replace"))


def take_json(call, *args):
    """Runs a function of json.h that returns a string, and the string."""
    out, n, err = ctypes.c_void_p(), ctypes.c_size_t(), _MlError()
    check(call(*args, ctypes.byref(out), ctypes.byref(n), ctypes.byref(err)), err)
    try:
        return ctypes.string_at(out, n.value).decode("utf-8")
    finally:
        lib.ml_json_free(out)
