# Included by CMake after each project() of llama.cpp's build (CMake's
# CMAKE_PROJECT_INCLUDE, set in .cargo/config.toml and by bench/compare).
# llama.cpp's AMX kernels crash in their first product on Q4_K weights
# (ggml_backend_amx_mul_mat, llama.cpp#20824), so on x86-64 the compiler is
# told the CPU has no AMX-INT8, whatever -march=native finds: ggml compiles
# those kernels only under __AMX_INT8__. An explicit -mno-* wins over
# -march in GCC and Clang alike, wherever it stands on the command line.
if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$" AND NOT MSVC)
  add_compile_options(-mno-amx-int8)
endif()
