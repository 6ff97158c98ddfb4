"""Native leaf names without bcc's symbolizer (cpu_elf.py), and when bcc's is not asked.

bcc before 0.33 closes a stale file descriptor each time its symbolizer
loads a process's modules; the daemon then names leaves from the maps and
the module files. These tests read real ELF files: this process's libc and
libstdc++ (a C++ name demangled), a module reached only through a fixture
/proc/PID/root (a container's), and the version gate.
"""

import ctypes
import ctypes.util
import os
import shutil

from stallscope.probes.cpu_elf import MapsSymbolizer, _Demangler
from stallscope.probes.cpu_stacks import _Natives, bcc_symbolizer_safe


def _libc_path_and_getpid():
    addr = ctypes.cast(ctypes.CDLL(None).getpid, ctypes.c_void_p).value
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= addr < hi:
                return line.split(None, 5)[5].strip(), addr, line
    raise AssertionError("getpid is not in a mapped module")


def test_this_processes_libc_function_is_named_with_its_module():
    path, addr, _ = _libc_path_and_getpid()
    name, module = MapsSymbolizer().resolve(os.getpid(), addr)
    assert name == b"getpid" and module == path.encode()


def test_cpp_names_are_demangled_and_others_kept():
    d = _Demangler()
    assert d(b"_ZNSt6vectorIiSaIiEE9push_backERKi") == (
        b"std::vector<int, std::allocator<int> >::push_back(int const&)"
    )
    assert d(b"deflate") == b"deflate"
    assert d(b"_Znot a name") == b"_Znot a name"  # not demangled: kept as it is
    assert d(None) is None


def test_a_module_only_in_the_processes_root_is_read_there(tmp_path):
    # A container's library: its maps path does not exist in the daemon's
    # mount namespace, only under /proc/PID/root (here a fixture tree).
    libc, addr, line = _libc_path_and_getpid()
    pid = 4242
    root = tmp_path / "proc" / str(pid) / "root"
    inside = "/opt/container-only/libc.so.6"
    (root / inside.lstrip("/")).parent.mkdir(parents=True)
    shutil.copy(libc, root / inside.lstrip("/"))
    st = os.stat(root / inside.lstrip("/"))
    fields = line.split(None, 5)
    fields[3] = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}"
    fields[4] = str(st.st_ino)
    fields[5] = inside
    (tmp_path / "proc" / str(pid) / "maps").write_text(" ".join(fields) + "\n")
    name, module = MapsSymbolizer(str(tmp_path / "proc")).resolve(pid, addr)
    assert name == b"getpid" and module == inside.encode()
    # the same path with another inode is someone else's file: unnamed
    fields[4] = str(st.st_ino + 1)
    (tmp_path / "proc" / str(pid) / "maps").write_text(" ".join(fields) + "\n")
    name, module = MapsSymbolizer(str(tmp_path / "proc")).resolve(pid, addr)
    assert name is None and module == inside.encode()


def test_bcc_symbolizer_is_used_only_from_0_33():
    assert not bcc_symbolizer_safe("0.26.0")
    assert not bcc_symbolizer_safe("0.32.9")
    assert bcc_symbolizer_safe("0.33.0") and bcc_symbolizer_safe("1.0")
    assert not bcc_symbolizer_safe("garbage")
    natives = _Natives(use_bcc=False)
    path, addr, _ = _libc_path_and_getpid()
    assert natives.content(os.getpid(), addr) == ("native", path, "getpid", None)
    assert natives._caches == {}  # no bcc SymbolCache was made


def test_every_function_start_of_a_real_library_resolves_to_a_function_there():
    # libstdc++: thousands of functions, C++ aliases (C1/C2 constructors at
    # one address) and local symbols; the table is mapped and sorted with
    # NumPy. Every function's start and last byte name a function whose
    # range holds it; an address past the last function is unnamed.
    from stallscope.probes.cpu_elf import _Module

    ctypes.CDLL(ctypes.util.find_library("stdc++"))  # mapped in this process
    with open("/proc/self/maps") as f:
        lib = next(line.split(None, 5)[5].strip() for line in f if "libstdc++" in line)
    mod = _Module(lib)
    starts, ends = mod.starts.tolist(), mod.ends.tolist()
    assert len(starts) > 1000
    by_name = {}
    for s, e, n in zip(starts, ends, mod.names, strict=True):
        by_name.setdefault(n, []).append((s, e))
    for s, e in zip(starts[::7], ends[::7], strict=True):
        for addr in (s, e - 1):
            name = mod.name(addr)
            assert name is not None and any(a <= addr < b for a, b in by_name[name]), hex(addr)
    assert mod.name(max(ends) + 4096) is None


def _fake_maps(tmp_path, pid, lines):
    (tmp_path / "proc" / str(pid)).mkdir(parents=True, exist_ok=True)
    (tmp_path / "proc" / str(pid) / "maps").write_text("".join(lines))


def _counted_natives(tmp_path):
    """_Natives on the maps symbolizer of a fixture /proc, counting maps reads."""
    natives = _Natives(use_bcc=False)
    natives._maps = MapsSymbolizer(str(tmp_path / "proc"))
    reads = []
    read = natives._maps._read_maps
    natives._maps._read_maps = lambda pid: reads.append(pid) or read(pid)
    return natives, reads


ANON_CODE = "7f0000000000-7f0000100000 r-xp 00000000 00:00 0 \n"  # a JIT's code


def test_a_drain_of_addresses_outside_every_mapping_reads_the_maps_at_most_twice(tmp_path):
    # The first read, then one re-read a drain in case a library was mapped
    # since (dlopen). The re-read once stayed on for the rest of the drain:
    # every new address read the maps again, 600 reads of a vLLM process's
    # thousands of lines a run (2.5 s of the sampler's CPU; it preempted the
    # engine core for 330 ms in a 3 s serving burst).
    _, _, line = _libc_path_and_getpid()
    pid = 4343
    _fake_maps(tmp_path, pid, [line])
    natives, reads = _counted_natives(tmp_path)
    natives.begin_drain()
    for k in range(50):
        assert natives.content(pid, 0x1000 + 16 * k) == ("native", None, None, None)
    assert len(reads) == 2, reads
    natives.begin_drain()
    natives.content(pid, 0x9000)
    assert len(reads) == 3, reads


def test_an_address_in_anonymous_code_is_no_reason_to_read_the_maps_again(tmp_path):
    _, _, line = _libc_path_and_getpid()
    pid = 4344
    _fake_maps(tmp_path, pid, [line, ANON_CODE])
    natives, reads = _counted_natives(tmp_path)
    for drain in range(3):
        natives.begin_drain()
        for k in range(20):
            ip = 0x7F0000000000 + 4096 * k + drain
            assert natives.content(pid, ip) == ("native", None, None, None)
    assert len(reads) == 1, reads


def test_a_library_mapped_after_the_maps_were_read_is_found(tmp_path):
    path, addr, line = _libc_path_and_getpid()
    pid = 4345
    _fake_maps(tmp_path, pid, [ANON_CODE])
    natives, reads = _counted_natives(tmp_path)
    natives.begin_drain()
    assert natives.content(pid, 0x7F0000000010) == ("native", None, None, None)
    _fake_maps(tmp_path, pid, [ANON_CODE, line])  # dlopen'ed since
    assert natives.content(pid, addr) == ("native", path, "getpid", None)
    assert len(reads) == 2, reads
