# What the CLI test scripts share to record their checks: fail (counted, the script exits 1 at the end
# when any failed), ok, and json_has. Sourced, never run.
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
ok() { echo "ok: $*"; }
json_has() {  # file, python expression over j that must be true
  /usr/bin/python3 -c "import json,sys; j=json.load(open(sys.argv[1])); sys.exit(0 if ($2) else 1)" "$1"
}
