#!/usr/bin/env bash
# Installs a build into a temporary prefix and builds consumers against the prefix alone:
# examples/embed through find_package(flexjit) (its build warms the kernel cache with
# `flexjit compile`; it then runs on the CPU backend), and a C and a C++ program through
# pkg-config. Fails if a consumer's compile line names a dependency flexjit keeps private.
#   tests/install/install_test.sh BUILD_DIR SOURCE_DIR C_COMPILER CXX_COMPILER
set -euo pipefail
build=$1 source=$2 cc=$3 cxx=$4
work=$(mktemp -d "${TMPDIR:-/tmp}/flexjit-install.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
step() { echo "--- $*"; }

step "cmake --install $build --prefix <tmp>"
cmake --install "$build" --prefix "$prefix" > "$work/install.log"
for f in include/flexjit/flexjit.h include/flexjit/flexjit.hpp include/flexjit/dsl/spec.h bin/flexjit; do
  test -e "$prefix/$f" || { echo "missing from the prefix: $f"; exit 1; }
done
libdir=$(dirname "$(find "$prefix" -name libflexjit.so -print -quit)")
for f in libflexjit.a libflexjit_cpu.so libflexjit_cpu.a pkgconfig/flexjit.pc pkgconfig/flexjit_cpu.pc cmake/flexjit/flexjitConfig.cmake; do
  test -e "$libdir/$f" || { echo "missing from the prefix: lib/$f"; exit 1; }
done

# What a consumer's compile line must not name: flexjit's private dependencies and its trees.
private_pattern="nvrtc|llvm|fmt|nlohmann|xxhash|eigen|$source|$build"
check_flags() {  # what, flags
  if grep -Eqi -- "$private_pattern" <<< "$2"; then
    echo "$1 names a private dependency or a flexjit tree: $2"
    exit 1
  fi
}

step "examples/embed with find_package(flexjit)"
cmake -S "$source/examples/embed" -B "$work/embed" -G Ninja -DCMAKE_C_COMPILER="$cc" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_EXPORT_COMPILE_COMMANDS=ON -DEMBED_ARCHS=sm_90a -DEMBED_CACHE_DIR="$work/kernel-cache" > "$work/embed-configure.log"
cmake --build "$work/embed"
# The flags on the example's compile line (the part before the output and source files),
# less the CUDA include directory the example adds itself for cuda.h, come from flexjit::*.
flags=$(grep '"command"' "$work/embed/compile_commands.json" | sed -e 's/ -o .*//' -e 's/-DEMBED_[A-Z_]*=[^ ]*//g' -e 's#-isystem [^ ]*cuda[^ ]*include##')
check_flags "embed_decode's compile flags" "$flags"
test -n "$(ls -A "$work/kernel-cache")" || { echo "flexjit compile left the kernel cache empty"; exit 1; }
EMBED_DEVICE=cpu "$work/embed/embed_decode"

step "examples/embed linked with the static libraries"
cmake -S "$source/examples/embed" -B "$work/embed-static" -G Ninja -DCMAKE_C_COMPILER="$cc" -DCMAKE_PREFIX_PATH="$prefix" \
  -DEMBED_STATIC=ON -DEMBED_ARCHS= -DEMBED_CACHE_DIR="$work/kernel-cache" > "$work/embed-static-configure.log"
cmake --build "$work/embed-static"
EMBED_DEVICE=cpu "$work/embed-static/embed_decode"

step "a C program with pkg-config flexjit_cpu"
export PKG_CONFIG_PATH=$libdir/pkgconfig
cflags=$(pkg-config --cflags flexjit_cpu)
check_flags "pkg-config --cflags flexjit_cpu" "$cflags"
"$cc" -std=c11 -Wall -Wextra -Werror "$source/tests/install/pkgconfig_consumer.c" $cflags $(pkg-config --libs flexjit_cpu) -lm \
  -Wl,-rpath,"$libdir" -o "$work/pkgconfig_consumer"
"$work/pkgconfig_consumer"

step "a C++ program with pkg-config flexjit"
cflags=$(pkg-config --cflags flexjit)
check_flags "pkg-config --cflags flexjit" "$cflags"
"$cxx" -std=c++20 -Wall -Wextra -Werror "$source/tests/install/cxx_consumer.cpp" $cflags $(pkg-config --libs flexjit) \
  -Wl,-rpath,"$libdir" -o "$work/cxx_consumer"
"$work/cxx_consumer"
echo "install_test: OK"
