"""Front ends: thin layers that parse their own input and call the core.

* :mod:`.jit`: the ``jit()`` decorator;
* :mod:`.magic` (with :mod:`.cell`, :mod:`.capture`, :mod:`.cache_listing`,
  :mod:`.doctor`): the IPython magics ``%%pnex``, ``%pnex_cache``,
  ``%pnex_doctor``;
* :mod:`.jax`: ``pnex_magic.jax_op``, a pnex op as a JAX function.

``import pnex_magic`` imports none of them: :mod:`.jit` loads with the first use of
``pnex_magic.jit``, the IPython modules with ``%load_ext pnex_magic``, and :mod:`.jax`
(and JAX) with the first ``jax_op()``.
"""
