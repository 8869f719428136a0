"""The local PD runtime as installed (`./tandem test` and `./tandem up` install it): every process it starts may use
AMX tiles where the CPU has them, a spawned one too (vLLM's engine and worker processes are spawned). Without that,
on a Sapphire Rapids machine, the decode's first step after KV arrived over NIXL died of SIGILL in vLLM's CPU
attention (local/amx_permission.py), and every request through the PD stack failed."""
import subprocess

import pytest

from tests.e2e.conftest import RUNTIME

ASK = """
import ctypes, multiprocessing

def xcomp(code):
    bits = ctypes.c_ulong(0)
    ok = ctypes.CDLL(None, use_errno=True).syscall(158, code, ctypes.byref(bits)) == 0
    return bits.value if ok else None

def permitted(queue):
    queue.put(xcomp(0x1022))  # ARCH_GET_XCOMP_PERM

if __name__ == "__main__":
    supported = xcomp(0x1021)  # ARCH_GET_XCOMP_SUPP
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=permitted, args=(queue,))
    child.start()
    print(supported, xcomp(0x1022), queue.get(timeout=60))
    child.join()
"""
XTILEDATA = 1 << 18


def test_every_process_of_the_runtime_may_use_amx_tiles_where_the_cpu_has_them(tmp_path):
    script = tmp_path / "ask.py"
    script.write_text(ASK)
    out = subprocess.run([str(RUNTIME / "venv" / "bin" / "python"), str(script)], capture_output=True, text=True,
                         check=True, timeout=120, cwd=tmp_path).stdout
    supported, own, spawned = (None if v == "None" else int(v) for v in out.split())
    if supported is None or not supported & XTILEDATA:
        pytest.skip(f"this CPU or kernel has no AMX tiles (ARCH_GET_XCOMP_SUPP: {supported})")
    assert own & XTILEDATA and spawned & XTILEDATA, (hex(own), hex(spawned))
