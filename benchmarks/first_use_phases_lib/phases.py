"""The phases ``benchmarks/first_use_phases.py`` charges time to: ``HOOKS`` (which of pnex's and
Numba's functions open which phase), ``KERNEL_PHASES`` (the rows, in order) and Numba's passes by
name (``_pass_phase``)."""

from __future__ import annotations


# (module, attribute path, phase).  A phase of None: named by Numba's pass (see _pass_phase).
TYPING_SETUP = "Numba typing set-up (contexts, registries)"
HOOKS: tuple[tuple[str, str, str | None], ...] = (
    ("pnex_magic.define", "definition", "spec, snapshot, fingerprint"),
    ("pnex_magic.definition", "toolchain_versions", "toolchain versions (metadata)"),
    ("pnex_magic.cache", "load", "disk cache lookup"),
    ("pnex_magic.cache", "store", "disk cache store"),
    ("pnex_magic.definition", "KernelDefinition.compile_function", "kernel function for Numba"),
    ("pnex_magic.vector", "register_cuda", "pnex's Numba extensions"),
    ("pnex_magic.random", "register_cuda", "pnex's Numba extensions"),
    ("pnex_magic.tc.lowering", "register_cuda", "pnex's Numba extensions"),
    ("pnex_magic.warmup", "wait", "waiting for the background warm-up"),
    ("numba.cuda.compiler", "compile", "Numba compile, other"),
    ("pnex_magic.numbasetup", "typing_setup", TYPING_SETUP),
    ("numba.cuda.target", "CUDATypingContext.__init__", TYPING_SETUP),
    ("numba.cuda.target", "CUDATargetContext.__init__", TYPING_SETUP),
    ("numba.cuda.typing.context", "BaseContext.refresh", TYPING_SETUP),
    ("numba.cuda.core.base", "BaseContext.refresh", TYPING_SETUP),
    ("numba.cuda.core.compiler_machinery", "PassManager._runPass", None),
    ("numba.cuda.cudadrv.nvvm", "compile_ir", "NVVM: LLVM IR to PTX"),
    ("numba.cuda.cudadrv.nvvm", "LibDevice.__init__", "NVVM: libdevice load"),
    ("pnex_magic.compiler", "link_cubin", "nvJitLink: PTX to cubin"),
    ("pnex_magic.define", "make_op", "torch op registration"),
    ("pnex_magic.launch.native", "load_launcher", "C++ launcher load"),
)
KERNEL_PHASES = (
    "pnex.jit (definition path imports)", "spec, snapshot, fingerprint", "toolchain versions (metadata)",
    "disk cache lookup", "kernel function for Numba", "pnex's Numba extensions", "waiting for the background warm-up",
    TYPING_SETUP, "Numba: bytecode to IR", "Numba: typing the kernel", "Numba: lowering to LLVM IR",
    "Numba: other passes", "Numba compile, other", "NVVM: libdevice load", "NVVM: LLVM IR to PTX",
    "nvJitLink: PTX to cubin", "disk cache store", "torch op registration", "C++ launcher load", "first call",
    "other",
)


def _pass_phase(pss) -> str:
    name = pss.name() if hasattr(pss, "name") else type(pss).__name__
    if "type_inference" in name or "typeinfer" in name.lower():
        return "Numba: typing the kernel"
    if "lowering" in name:
        return "Numba: lowering to LLVM IR"
    if name in ("translate_bytecode", "fixup_args", "ir_processing", "with_lifting", "inline_closure_likes",
                "rewrite_semantic_constants", "dead_branch_prune", "generic_rewrites", "make_function_op_code_to_jit",
                "inline_inlinables", "find_literally", "literal_unroll", "reconstruct_ssa", "rewrite_dynamic_raises",
                "literal_propagation_subpipeline", "canonicalize_loop_entry", "canonicalize_loop_exit",
                "transform_literal_unroll_const_list", "ir_legalization"):
        return "Numba: bytecode to IR"
    return "Numba: other passes"
