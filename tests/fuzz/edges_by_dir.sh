#!/usr/bin/env bash
# Covered edges of a fuzz target per source directory, from replaying a corpus: the figure
# docs/FUZZING.md records (libFuzzer's own `cov:` counts every instrumented edge,
# the templates, runtime and the target itself included).
#
#   tests/fuzz/edges_by_dir.sh BUILD/tests/fuzz/fuzz_frontend CORPUS_DIR...
set -euo pipefail
bin=${1:?usage: edges_by_dir.sh FUZZ_BINARY CORPUS_DIR...}
shift
"$bin" -runs=0 -print_coverage=1 "$@" 2>&1 | awk '
  /^COVERED_FUNC:/ {
    split($5, e, "/"); file = $NF; sub(/:[0-9]+$/, "", file)
    n = split(file, parts, "/"); dir = "other"
    for (i = 1; i < n; i++) if (parts[i] ~ /^(dsl|compiler|runtime|tests|kernels_templates|tools)$/) { dir = parts[i]; if (parts[i+1] == "cpu" || parts[i+1] == "capi" || parts[i+1] == "codegen" || parts[i+1] == "passes") dir = dir "/" parts[i+1]; break }
    covered[dir] += e[1]; total[dir] += e[2]
  }
  END {
    for (d in covered) printf "%-20s %6d of %6d edges in covered functions\n", d, covered[d], total[d]
    printf "%-20s %6d\n", "dsl+compiler", covered["dsl"] + covered["compiler"] + covered["compiler/codegen"] + covered["compiler/passes"]
  }' | sort
