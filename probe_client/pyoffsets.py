"""Where CPython keeps what the CPU sampler walks, per minor version: a contract.

One table, shared by the probe client's introspection (`_pythreads.py`,
which checks it against the live interpreter before it reports anything)
and the daemon (`stallscope/probes/cpu_bcc.py`, which checks every report
against it and the BPF program's object heads before it copies a layout
into the kernel). Values are byte offsets on x86-64 GIL builds, as gcc lays
the structs out from each version's own installed headers; at run time the
client overrides what the interpreter itself can tell: code-object members
from `PyCode_Type.tp_members`, `co_code_adaptive` from
`PyCode_Type.tp_basicsize`, and on 3.13+ everything `_Py_DebugOffsets`
carries. A version not in the table is refused, never guessed. Standard
library only, Python 3.6 syntax: it is imported inside the traced
interpreter, whatever its version, and must refuse an old one, not fail.
"""

# frame_kind: how a frame is laid out and what its instruction field means
# (cpu_bcc.h FRAMES_*; 0 there means "no Python frames")
FRAME_OBJECT = 1  # 3.10: PyFrameObject chain, f_lasti = index of the last code unit
FRAME_PREV_INSTR = 2  # 3.11, 3.12: _PyInterpreterFrame, prev_instr = last executed unit
FRAME_INSTR_PTR = 3  # 3.13: _PyInterpreterFrame, instr_ptr = unit executing now

NONE = -1  # field absent in this version

OWNER_GENERATOR = 1
OWNER_CSTACK = 3  # 3.12+: C-stack shim frame, never a Python function

_COMMON = {
    "ob_type": 8,
    "ts_next": 8,
    "str_length": 16,
    "str_state": 32,
    "bytes_size": 16,
    "bytes_data": 32,
    "tp_name": 24,
    "tp_basicsize": 32,
    "tp_itemsize": 40,
    "tp_members": 240,
    "memberdef_size": 40,
    "memberdef_offset": 16,
}

LAYOUTS = {
    (3, 10): {
        "frame_kind": FRAME_OBJECT,
        "ts_thread_id": 176,
        "ts_native_thread_id": NONE,
        "ts_frame": 24,  # tstate->frame (PyFrameObject *)
        "cframe_frame": NONE,
        "f_code": 32,
        "f_back": 24,
        "f_instr": 96,  # int f_lasti
        "f_owner": NONE,
        "owner_cstack": NONE,
        "frame_read": 104,
        "co_argcount": 16,
        "co_flags": 36,
        "co_firstlineno": 40,
        "co_name": 112,
        "co_qualname": NONE,
        "co_filename": 104,
        "co_linetable": 120,
        "co_firsttraceable": NONE,
        "co_code_adaptive": NONE,
        "code_read": 128,
        "str_ascii_data": 48,
        "str_compact_data": 72,
        "str_utf8_length": 48,
        "str_utf8": 56,
        "rt_gil_last_holder": 360,  # _PyRuntime.ceval.gil.last_holder
        "interp_ceval_gil": NONE,
        "gil_last_holder": NONE,
    },
    (3, 11): {
        "frame_kind": FRAME_PREV_INSTR,
        "ts_thread_id": 152,
        "ts_native_thread_id": 160,
        "ts_frame": 56,  # tstate->cframe
        "cframe_frame": 8,  # cframe->current_frame
        "f_code": 32,
        "f_back": 48,
        "f_instr": 56,  # prev_instr
        "f_owner": 69,
        "owner_cstack": NONE,
        "frame_read": 72,
        "co_argcount": 56,
        "co_flags": 48,
        "co_firstlineno": 72,
        "co_name": 120,
        "co_qualname": 128,
        "co_filename": 112,
        "co_linetable": 136,
        "co_firsttraceable": 168,
        "co_code_adaptive": 184,
        "code_read": 176,
        "str_ascii_data": 48,
        "str_compact_data": 72,
        "str_utf8_length": 48,
        "str_utf8": 56,
        "rt_gil_last_holder": 368,
        "interp_ceval_gil": NONE,
        "gil_last_holder": NONE,
    },
    (3, 12): {
        "frame_kind": FRAME_PREV_INSTR,
        "ts_thread_id": 136,
        "ts_native_thread_id": 144,
        "ts_frame": 56,  # tstate->cframe
        "cframe_frame": 0,  # cframe->current_frame
        "f_code": 0,
        "f_back": 8,
        "f_instr": 56,  # prev_instr
        "f_owner": 70,
        "owner_cstack": OWNER_CSTACK,
        "frame_read": 72,
        "co_argcount": 52,
        "co_flags": 48,
        "co_firstlineno": 68,
        "co_name": 120,
        "co_qualname": 128,
        "co_filename": 112,
        "co_linetable": 136,
        "co_firsttraceable": 176,
        "co_code_adaptive": 192,
        "code_read": 184,
        "str_ascii_data": 40,
        "str_compact_data": 56,
        "str_utf8_length": 40,
        "str_utf8": 48,
        "rt_gil_last_holder": NONE,
        "interp_ceval_gil": 384,  # interp->ceval.gil (a pointer)
        "gil_last_holder": 8,  # gil->last_holder
    },
    (3, 13): {
        "frame_kind": FRAME_INSTR_PTR,
        "ts_thread_id": 152,
        "ts_native_thread_id": 160,
        "ts_frame": 72,  # tstate->current_frame (no cframe)
        "cframe_frame": NONE,
        "f_code": 0,  # f_executable (may be another object: type-checked)
        "f_back": 8,
        "f_instr": 56,  # instr_ptr
        "f_owner": 70,
        "owner_cstack": OWNER_CSTACK,
        "frame_read": 72,
        "co_argcount": 52,
        "co_flags": 48,
        "co_firstlineno": 68,
        "co_name": 120,
        "co_qualname": 128,
        "co_filename": 112,
        "co_linetable": 136,
        "co_firsttraceable": 184,
        "co_code_adaptive": 200,
        "code_read": 192,
        "str_ascii_data": 40,
        "str_compact_data": 56,
        "str_utf8_length": 40,
        "str_utf8": 48,
        "rt_gil_last_holder": NONE,
        "interp_ceval_gil": 16,
        "gil_last_holder": 8,
        "interp_gil_holder": NONE,  # only from _Py_DebugOffsets
    },
}
for _v in LAYOUTS.values():
    _v.setdefault("interp_gil_holder", NONE)
    for _k, _x in _COMMON.items():
        _v.setdefault(_k, _x)
    _v["str_read"] = (_v["str_state"] + 4 + 7) & ~7  # length, hash, state
    _v["ts_read"] = max(_v["ts_frame"], _v["ts_native_thread_id"]) + 8

SUPPORTED = tuple(sorted(LAYOUTS))

# tp_members names -> layout keys (the interpreter's own word on code fields)
CODE_MEMBERS = {
    "co_argcount": "co_argcount",
    "co_flags": "co_flags",
    "co_firstlineno": "co_firstlineno",
    "co_name": "co_name",
    "co_qualname": "co_qualname",
    "co_filename": "co_filename",
    "co_linetable": "co_linetable",
}

# _Py_DebugOffsets (3.13): u64 fields in declaration order, per section
DEBUG_OFFSETS_313 = [
    ("cookie", None),  # char[8]
    ("version", None),
    ("free_threaded", None),
    ("runtime_state", ["size", "finalizing", "interpreters_head"]),
    (
        "interpreter_state",
        [
            "size",
            "id",
            "next",
            "threads_head",
            "gc",
            "imports_modules",
            "sysdict",
            "builtins",
            "ceval_gil",
            "gil_runtime_state",
            "gil_runtime_state_enabled",
            "gil_runtime_state_locked",
            "gil_runtime_state_holder",
        ],
    ),
    (
        "thread_state",
        [
            "size",
            "prev",
            "next",
            "interp",
            "current_frame",
            "thread_id",
            "native_thread_id",
            "datastack_chunk",
            "status",
        ],
    ),
    ("interpreter_frame", ["size", "previous", "executable", "instr_ptr", "localsplus", "owner"]),
    (
        "code_object",
        [
            "size",
            "filename",
            "name",
            "qualname",
            "linetable",
            "firstlineno",
            "argcount",
            "localsplusnames",
            "localspluskinds",
            "co_code_adaptive",
        ],
    ),
    ("pyobject", ["size", "ob_type"]),
    ("type_object", ["size", "tp_name", "tp_repr", "tp_flags"]),
    ("tuple_object", ["size", "ob_item", "ob_size"]),
    ("list_object", ["size", "ob_item", "ob_size"]),
    ("dict_object", ["size", "ma_keys", "ma_values"]),
    ("float_object", ["size", "ob_fval"]),
    ("long_object", ["size", "lv_tag", "ob_digit"]),
    ("bytes_object", ["size", "ob_size", "ob_sval"]),
    ("unicode_object", ["size", "state", "length", "asciiobject_size"]),
    ("gc", ["size", "collecting"]),
]

# debug-offsets field -> layout key (3.13: these win over the table)
FROM_DEBUG_OFFSETS = {
    ("thread_state", "next"): "ts_next",
    ("thread_state", "current_frame"): "ts_frame",
    ("thread_state", "thread_id"): "ts_thread_id",
    ("thread_state", "native_thread_id"): "ts_native_thread_id",
    ("interpreter_frame", "previous"): "f_back",
    ("interpreter_frame", "executable"): "f_code",
    ("interpreter_frame", "instr_ptr"): "f_instr",
    ("interpreter_frame", "owner"): "f_owner",
    ("code_object", "filename"): "co_filename",
    ("code_object", "name"): "co_name",
    ("code_object", "qualname"): "co_qualname",
    ("code_object", "linetable"): "co_linetable",
    ("code_object", "firstlineno"): "co_firstlineno",
    ("code_object", "argcount"): "co_argcount",
    ("code_object", "co_code_adaptive"): "co_code_adaptive",
    ("pyobject", "ob_type"): "ob_type",
    ("bytes_object", "ob_size"): "bytes_size",
    ("bytes_object", "ob_sval"): "bytes_data",
    ("unicode_object", "state"): "str_state",
    ("unicode_object", "length"): "str_length",
    ("unicode_object", "asciiobject_size"): "str_ascii_data",
    ("interpreter_state", "ceval_gil"): "interp_ceval_gil",
    # offsetof(PyInterpreterState, _gil.last_holder): from the interpreter state
    ("interpreter_state", "gil_runtime_state_holder"): "interp_gil_holder",
}


def refusal(version_info, free_threaded=False, implementation="cpython", machine="x86_64"):
    """None when the table covers this interpreter, else why not (a sentence)."""
    v = tuple(version_info[:2])
    if implementation != "cpython":
        return f"not CPython ({implementation}): no frame layout known"
    if machine not in ("x86_64", "amd64"):
        return f"offsets are for x86-64, not {machine}"
    if free_threaded:
        return f"free-threaded build of {v[0]}.{v[1]}: frame layout not supported"
    if v not in LAYOUTS:
        known = ", ".join(f"{s[0]}.{s[1]}" for s in SUPPORTED)
        return f"CPython {v[0]}.{v[1]}: unknown frame layout (supported: {known})"
    return None


def layout_for(version_info):
    """A copy of the table entry for this version (KeyError if unknown)."""
    return dict(LAYOUTS[tuple(version_info[:2])])


# What the BPF program reads out of each object head: (layout key, width in
# bytes). The client sizes each head read from it (`*_read`: up to the last
# field used); the daemon refuses a report with an offset outside its head,
# misaligned, or a head read above the program's buffer.
HEAD_FIELDS = {
    "ts_read": (("ts_frame", 8), ("ts_native_thread_id", 8), ("ts_thread_id", 8)),
    "frame_read": (("f_code", 8), ("f_back", 8), ("f_instr", 8), ("f_owner", 1)),
    "code_read": (
        ("ob_type", 8),
        ("co_argcount", 4),
        ("co_flags", 4),
        ("co_firstlineno", 4),
        ("co_name", 8),
        ("co_qualname", 8),
        ("co_filename", 8),
        ("co_linetable", 8),
        ("co_firsttraceable", 4),
    ),
    "str_read": (("ob_type", 8), ("str_length", 8), ("str_state", 4)),
}

# Keys of a layout report: every one must be present and an int.
LAYOUT_KEYS = tuple(sorted(set(LAYOUTS[(3, 11)]) | {"gil_holder", "pthread_tid"}))
