# Sourced by tools/bench-*.sh: the flags every benchmark takes and the token file they share.
# The caller sets its defaults (threads, reps, out) first, then calls
#   bench_parse_args NAME "$@"
# which overwrites them from --threads N, --reps N, --out DIR and rejects anything else in one
# line naming the flag. bench_random_tokens FILE N writes N token ids (seed 1, ids 66..511: the
# tiny models' ordinary tokens) as a JSON list, the same list in every benchmark.

bench_parse_args() {
  local name=$1
  shift
  while [[ $# -gt 0 ]]; do
    case $1 in
      --threads|--reps|--out)
        [[ $# -ge 2 ]] || { echo "$name: $1 needs a value" >&2; exit 2; }
        printf -v "${1#--}" '%s' "$2"
        shift 2 ;;
      *) echo "$name: unknown argument $1" >&2; exit 2 ;;
    esac
  done
}

bench_random_tokens() {
  python3 -c "import json, random, sys; random.seed(1); json.dump([random.randrange(66, 512) for _ in range(int(sys.argv[2]))], open(sys.argv[1], 'w'))" "$1" "$2"
}
