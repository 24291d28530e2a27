# Source this on the GPU machine (the `device` tool), from the repo root, with .whl carried:
#   . benchmarks/device_setup.sh
# Installs the carried wheels (numpy<2.5 for numba-cuda 0.30, IPython, ipywidgets, nbclient,
# pytorch-numba-extension-jit 0.1.6) into /tmp/site and makes the repo importable.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PNEX_CACHE_DIR=/tmp/pnex-cache
# pytorch-numba-extension-jit looks for libcudart.so under site-packages/nvidia/cuda_runtime/lib
SP=$(python3 -c "import site; print(site.getsitepackages()[0])")
USER_SP=$(python3 -c "import site; print(site.getusersitepackages())")
mkdir -p "$USER_SP/nvidia/cuda_runtime/lib"
ln -sf "$SP/nvidia/cu13/lib/libcudart.so.13" "$USER_SP/nvidia/cuda_runtime/lib/libcudart.so"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
python3 -c "import torch, numpy, numba_cuda, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'numpy', numpy.__version__, 'gpus', torch.cuda.device_count())"
