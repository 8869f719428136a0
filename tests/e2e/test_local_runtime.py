"""The local PD runtime as installed (`./tandem test` and `./tandem up` install it): every process it starts may use
AMX tiles where the CPU has them, a spawned one too (vLLM's engine and worker processes are spawned). Without that,
on a Sapphire Rapids machine, the decode's first step after KV arrived over NIXL died of SIGILL in vLLM's CPU
attention (local/amx_permission.py), and every request through the PD stack failed."""
import json
import subprocess

from tests.e2e.conftest import RUNTIME

ASK = """
import ctypes, json, multiprocessing, sys

def xcomp(code):
    bits = ctypes.c_ulong(0)
    ok = ctypes.CDLL(None, use_errno=True).syscall(158, code, ctypes.byref(bits)) == 0
    return bits.value if ok else 0

def seen():
    # Whether the hook ran at this interpreter's start, and the AMX state it holds (ARCH_GET_XCOMP_PERM)
    return {"hook": "tandem_amx_permission" in sys.modules, "permitted": xcomp(0x1022)}

def child(queue):
    queue.put(seen())

if __name__ == "__main__":
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=child, args=(queue,))
    proc.start()
    print(json.dumps({"supported": xcomp(0x1021), "own": seen(), "spawned": queue.get(timeout=60)}))
    proc.join()
"""
XTILEDATA = 1 << 18


def test_every_process_of_the_runtime_asks_for_amx_tiles_and_holds_them_where_the_cpu_has_them(tmp_path):
    """The hook runs in a process of the runtime and in one it spawns, on any machine; where the CPU and kernel
    offer AMX tiles (ARCH_GET_XCOMP_SUPP), both hold them."""
    script = tmp_path / "ask.py"
    script.write_text(ASK)
    out = json.loads(subprocess.run([str(RUNTIME / "venv" / "bin" / "python"), str(script)], capture_output=True,
                                    text=True, check=True, timeout=120, cwd=tmp_path).stdout)
    assert out["own"]["hook"] and out["spawned"]["hook"], out
    expected = out["supported"] & XTILEDATA  # 0 where there is no AMX: nothing to hold
    assert (out["own"]["permitted"] & XTILEDATA, out["spawned"]["permitted"] & XTILEDATA) == (expected, expected), out
