"""Native leaf names from a process's maps and its module files, without bcc's symbolizer.

Used where bcc's cannot be: bcc reads a process's modules through
/proc/PID/root/..., which the kernel opens only to a ptrace-capable reader
(a daemon running as its own user, the unit's `User=stallscope`, with
CAP_PERFMON but no CAP_SYS_PTRACE, can read another user's /proc/PID/maps
but not that link), and bcc before 0.33 closes a stale file descriptor each
time it loads a process's modules (cpu_stacks.py). This module names leaves
from the maps and the module files themselves: opened by their path in the
daemon's own mount namespace, else through /proc/PID/root (a container's,
where the daemon may follow it), and only when the file is the one mapped
(same device and inode as the maps line says), so a container's library is
never named after the host's. Symbols: ELF64 `.symtab`, else `.dynsym`,
functions with their sizes (an address past a function's end is unnamed,
never the previous function's); C++ names demangled (libstdc++'s
`__cxa_demangle`, when it loads). Reads files only; bounded caches; never
raises (a failure is an unnamed leaf).
"""

import bisect
import ctypes
import ctypes.util
import mmap
import os
import struct

import numpy as np

MAX_MODULES = 256
MAX_DEMANGLED = 1 << 16
SHT_SYMTAB = 2
SHT_DYNSYM = 11
STT_FUNC = 2
STT_GNU_IFUNC = 10
PT_LOAD = 1
PF_X = 1


_SYM = np.dtype(
    [
        ("name", "<u4"),
        ("info", "u1"),
        ("other", "u1"),
        ("shndx", "<u2"),
        ("value", "<u8"),
        ("size", "<u8"),
    ]
)  # fmt: skip  (Elf64_Sym, 24 bytes)


class _Module:
    """One ELF file's function symbols and load bias.

    The file is mapped, not read (libtorch_cpu.so is 414 MB with 380,438
    functions: 0.09 s and no copy, against 2.8 s and a 562 MB peak for a
    read and a Python loop), its symbol table filtered and sorted with
    NumPy, and a name read from the mapped string table only when an
    address resolves to it (the map stays open while the module is cached:
    file pages, which the kernel may drop)."""

    __slots__ = ("starts", "ends", "name_offs", "bias", "_names", "_map", "_str")

    def __init__(self, path):
        self.starts = self.ends = self.name_offs = None
        self.bias, self._names, self._map, self._str = 0, {}, None, (0, 0)
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size < 64:
                return
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            self._load(data)
        finally:
            if self._map is None:
                data.close()

    def _load(self, data):
        if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
            return  # not a little-endian ELF64
        (phoff, shoff) = struct.unpack_from("<QQ", data, 32)
        phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", data, 54)
        # file offset -> ELF address: the executable LOAD segment's p_vaddr - p_offset
        for i in range(phnum):
            p_type, p_flags, p_offset, p_vaddr = struct.unpack_from(
                "<IIQQ", data, phoff + i * phentsize
            )
            if p_type == PT_LOAD and p_flags & PF_X:
                self.bias = p_vaddr - p_offset
                break
        sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
                    for i in range(shnum)]  # fmt: skip
        table = [s for s in sections if s[1] == SHT_SYMTAB] or [
            s for s in sections if s[1] == SHT_DYNSYM
        ]
        if not table:
            return
        _, _, _, _, off, size, link, _, _, entsize = table[0]
        if entsize != _SYM.itemsize or off + size > len(data):
            return
        syms = np.frombuffer(data, dtype=_SYM, count=size // _SYM.itemsize, offset=off)
        kind = syms["info"] & 0xF
        keep = ((kind == STT_FUNC) | (kind == STT_GNU_IFUNC)) & (syms["value"] != 0)
        keep &= syms["shndx"] != 0
        funcs = syms[keep]
        starts = funcs["value"]
        ends = starts + np.maximum(funcs["size"], 1)
        # by start, then end: of aliases at one address the widest is last,
        # the one a lookup lands on (memcpy and its aliases, say)
        order = np.lexsort((ends, starts))
        self.starts = starts[order]
        self.ends = ends[order]
        self.name_offs = funcs["name"][order].astype(np.int64)
        _, _, _, _, stroff, strsize, *_ = sections[link]
        if stroff + strsize > len(data):
            self.starts = self.ends = self.name_offs = None
            return
        self._map = data
        self._str = (stroff, stroff + strsize)  # the string table's span in the file

    @property
    def names(self):
        """Every function's name (bytes), in address order."""
        if self.name_offs is None:
            return []
        out = []
        for off in self.name_offs.tolist():
            out.append(self._name_at(off))
        return out

    def _name_at(self, off):
        start, limit = self._str[0] + off, self._str[1]
        end = self._map.find(b"\0", start, limit)
        return self._map[start : end if end >= 0 else limit]

    def name(self, elf_addr):
        if self.starts is None or not len(self.starts):
            return None
        if elf_addr < 0:
            return None
        # As a uint64: a Python int makes NumPy search a float64 copy of the
        # whole table (uint64 and int64 meet at float64): 230 us a lookup in
        # libtorch_cpu's 380k functions, against 0.8 us.
        k = int(self.starts.searchsorted(np.uint64(elf_addr), side="right")) - 1
        if k < 0 or elf_addr >= int(self.ends[k]):
            return None
        got = self._names.get(k)
        if got is None:
            got = self._names[k] = self._name_at(int(self.name_offs[k]))
        return got


class _Demangler:
    """Itanium C++ names (`_Z...`) demangled by libstdc++, cached; a name it
    cannot demangle (or no libstdc++) is returned as it is."""

    def __init__(self):
        self._fn = self._free = None
        self._cache = {}
        try:
            lib = ctypes.CDLL(ctypes.util.find_library("stdc++") or "libstdc++.so.6")
            fn = getattr(lib, "__cxa_demangle")  # (a name Python would mangle in a class)
            fn.restype = ctypes.c_void_p
            fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
            libc = ctypes.CDLL(None)
            libc.free.argtypes = [ctypes.c_void_p]
            self._fn, self._free = fn, libc.free
        except (OSError, AttributeError):
            pass

    def __call__(self, name):
        if not name or not name.startswith(b"_Z") or self._fn is None:
            return name
        got = self._cache.get(name)
        if got is None:
            status = ctypes.c_int(0)
            ptr = self._fn(name, None, None, ctypes.byref(status))
            got = name
            if ptr and status.value == 0:
                got = ctypes.string_at(ptr)
            if ptr:
                self._free(ptr)
            if len(self._cache) >= MAX_DEMANGLED:
                self._cache.clear()
            self._cache[name] = got
        return got


class MapsSymbolizer:
    """(function, module path) of a user address of a process, from its maps."""

    def __init__(self, proc_root="/proc"):
        self.proc_root = proc_root
        self._maps = {}  # pid -> [(start, end, offset, dev, inode, path)]
        self._modules = {}  # (path, dev, inode) -> _Module or None
        self._demangle = _Demangler()

    def forget(self, pid):
        self._maps.pop(pid, None)

    def resolve(self, pid, ip, refresh=False):
        """(name bytes or None, module path bytes or None); with `refresh`
        the maps are read anew first."""
        try:
            mapping = self._mapping(pid, ip, refresh)
            if mapping is None:
                return None, None
            start, _, offset, dev, inode, path = mapping
            if not path.startswith("/"):  # anonymous code (a JIT's), the vDSO
                return None, None
            module = self._module(pid, path, dev, inode)
            if module is None:
                return None, path.encode()
            name = module.name(ip - start + offset + module.bias)
            return self._demangle(name), path.encode()
        except Exception:
            return None, None

    def mapped(self, pid, ip):
        """Whether `ip` lay in an executable mapping of `pid` when its maps
        were last read, an anonymous one too (a JIT's code, the vDSO): a miss
        there is no reason to read the maps again (a vLLM process's maps
        are thousands of lines, 1-2 ms to read). False if never read."""
        entry = self._maps.get(pid)
        return entry is not None and self._find(entry, ip) is not None

    def _mapping(self, pid, ip, refresh):
        entry = self._maps.get(pid)
        if entry is None or refresh:
            entry = self._maps[pid] = self._read_maps(pid)
        return self._find(entry, ip)

    @staticmethod
    def _find(entry, ip):
        starts, maps = entry
        k = bisect.bisect_right(starts, ip) - 1
        if k < 0 or ip >= maps[k][1]:
            return None
        return maps[k]

    def _read_maps(self, pid):
        """([start of each mapping], [(start, end, offset, dev, inode, path)])
        of the executable mappings, sorted; path "" when anonymous."""
        out = []
        with open(f"{self.proc_root}/{pid}/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) < 5 or "x" not in parts[1]:
                    continue
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                major, minor = (int(x, 16) for x in parts[3].split(":"))
                path = parts[5].rstrip("\n") if len(parts) == 6 else ""
                out.append(
                    (lo, hi, int(parts[2], 16), os.makedev(major, minor), int(parts[4]), path)
                )
        out.sort()
        return [m[0] for m in out], out

    def _module(self, pid, path, dev, inode):
        key = (path, dev, inode)
        if key in self._modules:
            return self._modules[key]
        module = None
        # the daemon's own mount namespace first, then the process's root
        for candidate in (path, f"{self.proc_root}/{pid}/root{path}"):
            try:
                st = os.stat(candidate)
                if st.st_ino == inode and st.st_dev == dev:  # the very file that is mapped
                    module = _Module(candidate)
                    break
            except (OSError, ValueError, struct.error, IndexError):
                module = None
        if len(self._modules) >= MAX_MODULES:
            self._modules.clear()
        self._modules[key] = module
        return module
