# ddp_query_torch_wheel(PYTHON): what PYTHON's torch is, from one start of the interpreter.
#
# Importing torch takes 1.5-2 s of CPU (a CUDA build more); the configure once did it three
# times (LibTorch's CMake folder, the CUDA preparation, the Python extension's version check),
# and the test suite configures a torch build about ten times (issue 47). One import answers all
# of them; it also proves that PYTHON can import its torch. Sets, in the caller's scope:
#   DDP_TORCH_WHEEL_FOUND         TRUE when PYTHON imported torch, else FALSE (the rest empty)
#   DDP_TORCH_WHEEL_VERSION       torch.__version__ without its local label ("2.13.0")
#   DDP_TORCH_WHEEL_CUDA          torch.version.cuda, "" for a CPU build
#   DDP_TORCH_WHEEL_CMAKE_PREFIX  torch.utils.cmake_prefix_path (its TorchConfig.cmake's root)
#   DDP_TORCH_WHEEL_CUDA_RUNTIME  for a CUDA build, the folder of the nvidia CUDA runtime package
#                                 pip installed with it (include/ and lib/: nvidia/cu<major>, or
#                                 nvidia/cuda_runtime for the CUDA 12 wheels), else ""
#   DDP_PYTHON_PLATLIB            PYTHON's sysconfig platlib (site-packages)
# -I: the user's environment as it is, also inside pip's isolated build environment, which hides
# the site-packages that hold torch (pyproject.toml).
function(ddp_query_torch_wheel python)
  set(names VERSION CUDA CMAKE_PREFIX CUDA_RUNTIME)
  set(DDP_TORCH_WHEEL_FOUND FALSE PARENT_SCOPE)
  foreach(name IN LISTS names)
    set(DDP_TORCH_WHEEL_${name} "" PARENT_SCOPE)
  endforeach()
  set(DDP_PYTHON_PLATLIB "" PARENT_SCOPE)
  execute_process(
    COMMAND ${python} -I -c [=[
import importlib.util, os, sysconfig
import torch, torch.utils
cuda = torch.version.cuda or ""
runtime = ""
if cuda:
    for name in ("nvidia.cu" + cuda.split(".")[0], "nvidia.cuda_runtime"):
        try:
            spec = importlib.util.find_spec(name)
        except ImportError:
            spec = None
        folders = list(spec.submodule_search_locations or []) if spec else []
        found = [f for f in folders if os.path.isfile(os.path.join(f, "include", "cuda_runtime_api.h"))]
        if found:
            runtime = found[0]
            break
print(torch.__version__.split("+")[0], cuda, torch.utils.cmake_prefix_path, runtime,
      sysconfig.get_path("platlib"), sep="\n")
]=]
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_QUIET)
  if(NOT rc EQUAL 0)
    return()
  endif()
  # Five lines; empty ones (a CPU torch's CUDA fields) must keep their place in the list.
  string(REGEX REPLACE "\n$" "" out "${out}")
  string(REPLACE "\n" ";" fields "${out}")
  list(LENGTH fields count)
  if(NOT count EQUAL 5)
    return()
  endif()
  set(DDP_TORCH_WHEEL_FOUND TRUE PARENT_SCOPE)
  foreach(name IN LISTS names)
    list(POP_FRONT fields value)
    set(DDP_TORCH_WHEEL_${name} "${value}" PARENT_SCOPE)
  endforeach()
  list(POP_FRONT fields value)
  set(DDP_PYTHON_PLATLIB "${value}" PARENT_SCOPE)
endfunction()
