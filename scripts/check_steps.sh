# The step runner the check scripts share (scripts/gpu_check.sh, scripts/gpu_check_keras.sh):
# sourced after they set OUT (the output folder) and CHECK (the name their lines start with).
failed=0

step() {  # step NAME COMMAND...: run it, log it to OUT/NAME.log, time it, count a failure
  local name="$1" log="$OUT/$1.log" begin=$SECONDS status
  shift
  echo "[$CHECK] $name"
  "$@" >"$log" 2>&1
  status=$?
  ((status)) && failed=$((failed + 1))
  printf -- '- %s: %s in %d s (%s)\n' "$name" "$( ((status)) && echo "FAILED ($status)" || echo ok)" \
    $((SECONDS - begin)) "$log" | tee -a "$OUT/summary.md"
}
