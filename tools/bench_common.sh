# Sourced by tools/bench-*, tools/scale-proof.sh: one argument parser for every benchmark, and the
# token file they share.
#
# The caller sets its defaults first, lists the flags it takes, then parses:
#   samples=4 out=/tmp/x
#   bench_flags="samples out"       # flags with a value: --samples N sets $samples (- becomes _)
#   bench_switches="quick"          # flags without one: --quick sets $quick=1 (optional)
#   bench_parse_args NAME "$@"
# Without bench_flags the flags are "threads reps out". Everything after `--` lands in the array
# bench_extra (flags for headwise-calc); with bench_pass_unknown=1, so does every argument the
# list does not name. Anything else is rejected in one line naming the flag, exit 2.
# bench_random_tokens FILE N writes N token ids (seed 1, ids 66..511: the tiny models' ordinary
# tokens) as a JSON list, the same list in every benchmark.

bench_takes() {  # bench_takes LIST FLAG: whether FLAG (without --) is in the space-separated LIST
  [[ " $1 " == *" $2 "* ]]
}

bench_parse_args() {
  local name=$1 flag
  shift
  bench_extra=()
  while [[ $# -gt 0 ]]; do
    flag=${1#--}
    if [[ $1 == -- ]]; then
      shift
      bench_extra+=("$@")
      return
    elif [[ $1 == --* ]] && bench_takes "${bench_flags:-threads reps out}" "$flag"; then
      [[ $# -ge 2 ]] || { echo "$name: $1 needs a value" >&2; exit 2; }
      printf -v "${flag//-/_}" '%s' "$2"
      shift 2
    elif [[ $1 == --* ]] && bench_takes "${bench_switches:-}" "$flag"; then
      printf -v "${flag//-/_}" '%s' 1
      shift
    elif [[ ${bench_pass_unknown:-0} == 1 ]]; then
      bench_extra+=("$1")
      shift
    else
      echo "$name: unknown argument $1" >&2
      exit 2
    fi
  done
}

bench_random_tokens() {
  python3 -c "import json, random, sys; random.seed(1); json.dump([random.randrange(66, 512) for _ in range(int(sys.argv[2]))], open(sys.argv[1], 'w'))" "$1" "$2"
}
