# libtorch comes from the PyPI torch wheel; everything else from Debian packages.
if(NOT Torch_DIR)
  execute_process(
    COMMAND python3 -c "import torch; print(torch.utils.cmake_prefix_path)"
    OUTPUT_VARIABLE HEADWISE_TORCH_PREFIX OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE HEADWISE_TORCH_RC)
  if(NOT HEADWISE_TORCH_RC EQUAL 0)
    message(FATAL_ERROR "python3 cannot import torch: run tools/setup.sh first")
  endif()
  list(APPEND CMAKE_PREFIX_PATH ${HEADWISE_TORCH_PREFIX})
endif()

set(HEADWISE_CUDA_ENABLED OFF)
include(CheckLanguage)
if(HEADWISE_CUDA)
  check_language(CUDA)
endif()
if(HEADWISE_CUDA AND CMAKE_CUDA_COMPILER)
  enable_language(CUDA)
  # Hopper (H100/H200) is the GPU we run on; sm_80 keeps A100 users working.
  if(NOT CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 80 90)
  endif()
  set(CMAKE_CUDA_STANDARD 20)
  # CMake 3.25 knows no C++20 flag for nvcc 13 and then refuses to generate; nvcc 12+ takes it.
  if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  endif()
  # Without a GPU, torch's cmake would try to detect one by running a test program.
  if(NOT TORCH_CUDA_ARCH_LIST)
    set(TORCH_CUDA_ARCH_LIST "8.0;9.0")
  endif()
  # Torch's cmake wants these when it finds CUDA.
  set(CAFFE2_USE_CUDNN OFF)
  set(USE_CUDNN OFF)
endif()
find_package(Torch REQUIRED)
if(TORCH_CUDA_LIBRARIES OR TARGET torch_cuda)
  # Torch's cmake enables the CUDA language by itself when it finds CUDA; HEADWISE_CUDA=OFF
  # must still keep our kernels out.
  if(HEADWISE_CUDA AND CMAKE_CUDA_COMPILER)
    set(HEADWISE_CUDA_ENABLED ON)
  endif()
endif()
message(STATUS "headwise: torch ${Torch_VERSION} (pinned ${HEADWISE_PIN_TORCH_VERSION}), CUDA kernels: ${HEADWISE_CUDA_ENABLED}")

find_package(yaml-cpp REQUIRED)
find_package(nlohmann_json 3.11 REQUIRED)
find_package(spdlog REQUIRED)
find_package(CLI11 REQUIRED)
find_package(OpenSSL REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
# ICU: Unicode normalization (NFC/NFKC...) for tokenizer.json normalizers.
pkg_check_modules(ICU REQUIRED IMPORTED_TARGET icu-uc)

# torch's wheel ships fmt 12 headers in its include folder, which would shadow Debian's fmt 9
# that spdlog was built against. A -I shim pointing at Debian's fmt is searched before
# torch's -isystem folders; core ATen headers do not include fmt, so both stay consistent.
find_package(fmt REQUIRED)
get_target_property(HEADWISE_FMT_INCLUDE fmt::fmt INTERFACE_INCLUDE_DIRECTORIES)
if(NOT HEADWISE_FMT_INCLUDE)
  set(HEADWISE_FMT_INCLUDE /usr/include)
endif()
list(GET HEADWISE_FMT_INCLUDE 0 HEADWISE_FMT_INCLUDE)
set(HEADWISE_FMT_SHIM ${CMAKE_BINARY_DIR}/fmt-shim)
file(MAKE_DIRECTORY ${HEADWISE_FMT_SHIM})
file(CREATE_LINK ${HEADWISE_FMT_INCLUDE}/fmt ${HEADWISE_FMT_SHIM}/fmt SYMBOLIC)
