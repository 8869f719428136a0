"""Ask Linux for the AMX tile state in every process of the local PD runtime, before any kernel uses it.

local/install_runtime.sh copies this into the runtime venv's site-packages with a .pth line that imports it, so it
runs at each interpreter's start: Ray's workers and vLLM's engine and worker processes (spawned, so nothing asked
in a parent carries over). vLLM 0.32's CPU attention takes its AMX kernels wherever torch reports AMX tiles (bf16,
blocks of 32n) and never asks the kernel for them itself; Linux 5.16+ answers an AMX instruction from a process
that did not ask with SIGILL. A prefill asks without knowing it (oneDNN does before its own AMX matmuls), but a
decode whose first step starts from KV received over NIXL runs the attention kernel first: on a Sapphire Rapids
machine it died with `Fatal Python error: Illegal instruction` in `cpu_attention_with_kv_cache` at its first
request, every time. On a CPU or kernel without AMX the call fails and nothing changes.
"""
import ctypes
import platform

ARCH_REQ_XCOMP_PERM = 0x1023  # arch/x86/include/uapi/asm/prctl.h
XFEATURE_XTILEDATA = 18
SYS_ARCH_PRCTL = 158  # x86_64

if platform.machine() == "x86_64":
    try:
        ctypes.CDLL(None, use_errno=True).syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)
    except (OSError, AttributeError):
        pass
