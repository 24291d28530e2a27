"""The tensor-core GEMM examples' machine code, read without a GPU: compiled for sm_90a
(NVVM and nvJitLink wheels) and disassembled (cuobjdump or nvdisasm), the accumulators stay
in registers and the epilogue that stages them in shared memory is straight-line code.

That second property is what took the TMA GEMM from 0.54-0.72x to 0.90-0.99x cuBLAS on an
H200 (benchmarks/results/tensor-cores-2026-11-28-0933.json, then -1005.json): the epilogue
looped over the accumulator with ``literal_unroll``, whose copies ptxas leaves behind a
chain of compares on the index (a branch per earlier copy, for every copy), a fixed cost
per tile of C.  ``for j in range(BN // 8)`` (BN a compile-time constant) unrolls straight.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from toolchain import needs_nvvm

REPO = Path(__file__).resolve().parents[1]
ADDRESSED = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;")


def instructions(sass_text: str) -> list[str]:
    """The SASS instructions of a disassembly, one string each, in address order."""
    return [m.group(1) for m in ADDRESSED.finditer(sass_text)]


def staging_block(code: list[str], stores: int) -> list[str]:
    """The instructions from the first to the last of the ``stores`` shared-memory stores
    that follow the last ``HGMMA`` (the epilogue's staging of the accumulators)."""
    last_mma = max(i for i, op in enumerate(code) if "HGMMA" in op)
    sts = [i for i, op in enumerate(code) if i > last_mma and re.search(r"\bSTS\b", op)]
    assert len(sts) >= stores, f"expected {stores} shared-memory stores after the last HGMMA, found {len(sts)}"
    return code[sts[0]: sts[stores - 1] + 1]


def _disassembled(op):
    from pnex_magic import sass
    from pnex_magic.report import _definition_of

    if sass.find_disassembler() is None:
        pytest.skip("no cuobjdump or nvdisasm here (pip install nvidia-cuda-cuobjdump, or the sass extra)")
    compiled = _definition_of(op, "example").compiled("sm_90a")
    return compiled, sass.disassemble(compiled.cubin, entry=compiled.entry).text


def _examples():
    sys.path.insert(0, str(REPO / "examples" / "tensor_cores"))
    import gemm_tma
    import gemm_wgmma

    return gemm_tma, gemm_wgmma


@needs_nvvm
@pytest.mark.parametrize("kernel", ["tma", "persistent", "wgmma", "tma-gelu", "wgmma-gelu", "persistent-gelu"])
def test_the_gemm_epilogue_stages_the_accumulators_without_a_branch(kernel):
    """``tma-gelu``, ``wgmma-gelu``: the fused GELU epilogue stages its accumulators as
    float32, two 4-byte stores a pair (the GELU is applied in the store loop, after them).
    The persistent kernels stage 64 columns at a time in C's dtype, the GELU applied in
    registers before: 16 packed stores a chunk."""
    gemm_tma, gemm_wgmma = _examples()
    op = {"tma": lambda: gemm_tma.make_linear_tma("f16", 256, 4),
          "persistent": lambda: gemm_tma.make_linear_persistent("f16", 256, 3),
          "persistent-gelu": lambda: gemm_tma.make_linear_persistent("f16", 256, 4, gelu=True),
          "wgmma": lambda: gemm_wgmma.make_linear("f16", 128, 256, 4),
          "tma-gelu": lambda: gemm_tma.make_linear_tma("f16", 256, 4, gelu=True),
          "wgmma-gelu": lambda: gemm_wgmma.make_linear("f16", 128, 256, 4, gelu=True)}[kernel]()
    compiled, text = _disassembled(op)
    assert compiled.resources.local_bytes == 0 and compiled.resources.spill_store_bytes == 0, compiled.resources
    code = instructions(text)
    assert not any(re.search(r"\b(LDL|STL)\b", op) for op in code)  # the accumulators never leave registers
    assert sum("HGMMA.64x256x16.F32" in op for op in code) >= 4
    stores = 128 if kernel.endswith("gelu") else 64  # BN = 256: 32 n8 tiles, two packed stores each (gelu: four)
    if kernel.startswith("persistent"):
        stores = 16  # one chunk: 8 n8 tiles, two packed stores each
    block = staging_block(code, stores)
    assert all(re.fullmatch(r"STS(\.64)? \[.*", op) for op in block if "STS" in op)  # none predicated
    branches = [op for op in block if re.search(r"\b(BRA|EXIT)\b", op)]
    assert not branches, f"the epilogue's staging branches {len(branches)} times: {branches[:3]}"


def test_a_dispatch_chain_between_the_stores_is_found():
    """The check above, on SASS shaped as ``literal_unroll`` left it (2026-11-28, trimmed)."""
    text = """
        /*2170*/                   HGMMA.64x256x16.F32 R24, gdesc[UR20], R24, gsb0 ;
        /*5620*/               @P0 STS [R131], R24 ;
        /*5630*/               @P0 STS [R129], R26 ;
        /*5640*/               @P0 BRA 0x75c0 ;
        /*5650*/                   ISETP.NE.U32.AND P0, PT, R16, 0x1, PT ;
        /*5710*/               @P1 BRA 0x5690 ;
        /*5720*/                   STS [R127], R28 ;
        /*5730*/                   STS [R125], R30 ;
    """
    block = staging_block(instructions(text), 4)
    assert [op for op in block if "BRA" in op] == ["@P0 BRA 0x75c0", "@P1 BRA 0x5690"]
    straight = "\n".join(line for line in text.splitlines() if "BRA" not in line)
    assert not [op for op in staging_block(instructions(straight), 4) if "BRA" in op]
