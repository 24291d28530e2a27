"""What the child processes of the first-run tests (tests/test_first_run.py,
tests/test_first_run_gpu.py) share: source text that their scripts include."""

#: ``entered_python_call(op, *args)``: whether calling ``op`` runs ``PnexOp.__call__``
#: (the Python path) rather than the C call slot alone.
ENTERED_PYTHON_CALL = """
def entered_python_call(op, *args):
    import pnex_magic.op
    entered = []
    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_name == "__call__" and frame.f_code.co_filename == pnex_magic.op.__file__:
            entered.append(1)
    sys.setprofile(profile)
    try:
        op(*args)
    finally:
        sys.setprofile(None)
    return bool(entered)
"""
